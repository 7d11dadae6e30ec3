//! A connection's replies, in line order, and the `#SYNC`s it has in flight.
//!
//! A `#SYNC` does not stop its connection: its `OK` line is written into the
//! reply bytes at once, in its place among the other replies, and the
//! connection goes on reading, routing and answering. What waits is the
//! *writing*: reply bytes from a pending SYNC's `OK` line on are held back
//! until that SYNC is answerable, so a producer reads every reply in line
//! order, exactly as when each SYNC blocked its connection (an `ERR` for a
//! line after a pending SYNC arrives after that SYNC's `OK`).
//!
//! A pending SYNC is answerable once every owner shard the connection sent
//! events to since its previous SYNC has granted back the batch that
//! carried them ([`crate::shard::ingress::Route::sync_point`]); SYNCs are
//! answered oldest first, so the events before any earlier SYNC are covered
//! too. At most [`SYNCS_IN_FLIGHT_MAX`] are in flight: then the connection
//! stops parsing (and reading) until the oldest is answered.

use crate::config::{REPLY_BUFFER_BYTES_MAX, REPLY_LINE_SIZE_MAX, SYNCS_IN_FLIGHT_MAX};
use crate::protocol::control::write_ok;
use crate::shard::ingress::Ingress;

/// Reply buffer a connection allocates on its first reply and keeps between
/// writes, in bytes; a buffer that grew past it in a burst is given back
/// once written.
pub const REPLY_BUFFER_RETAINED_BYTES: usize = 4 * 1024;

/// The reply bytes of one connection and its pending SYNCs (a ring of at
/// most [`SYNCS_IN_FLIGHT_MAX`], allocated on the first SYNC).
pub struct Replies {
    bytes: Vec<u8>,
    /// Per ring slot: where its SYNC's `OK` line starts in `bytes`.
    starts: Vec<usize>,
    /// Per ring slot, `shard_count` batch sequences (by owner; 0: nothing
    /// to wait for) that must be granted before the SYNC is answered.
    sequences: Vec<u64>,
    /// The oldest pending SYNC's slot, and how many are pending.
    head: usize,
    pending: usize,
    shard_count: usize,
}

impl Replies {
    pub fn new(shard_count: usize) -> Replies {
        Replies { bytes: Vec::new(), starts: Vec::new(), sequences: Vec::new(), head: 0, pending: 0, shard_count }
    }

    /// The reply buffer to append one reply line to. It gets its retained
    /// size on first use, so that it grows by doubling from there and never
    /// past [`REPLY_BUFFER_BYTES_MAX`] + [`REPLY_LINE_SIZE_MAX`].
    pub fn line(&mut self) -> &mut Vec<u8> {
        if self.bytes.capacity() == 0 {
            self.bytes.reserve_exact(REPLY_BUFFER_RETAINED_BYTES);
        }
        &mut self.bytes
    }

    /// Whether one more reply line might not fit: write (or wait) first.
    pub fn is_full(&self) -> bool {
        self.bytes.len() + REPLY_LINE_SIZE_MAX > REPLY_BUFFER_BYTES_MAX
    }

    /// Whether [`SYNCS_IN_FLIGHT_MAX`] SYNCs are pending.
    pub fn syncs_full(&self) -> bool {
        self.pending == SYNCS_IN_FLIGHT_MAX
    }

    pub fn syncs_pending(&self) -> usize {
        self.pending
    }

    /// Bytes held now (for the connection's spare-memory accounting).
    pub fn capacity(&self) -> usize {
        self.bytes.capacity() + self.starts.capacity() * 8 + self.sequences.capacity() * 8
    }

    /// Adds a SYNC: its `OK` line goes in its place, held back until the
    /// SYNC is answerable; `fill` sets the batch sequences it waits for
    /// (one per owner, all 0 beforehand). The caller checked
    /// [`Replies::syncs_full`].
    pub fn push_sync(&mut self, line_number: u64, token: &[u8], fill: impl FnOnce(&mut [u64])) {
        assert!(self.pending < SYNCS_IN_FLIGHT_MAX, "the caller waits for room");
        if self.starts.is_empty() {
            self.starts = vec![0; SYNCS_IN_FLIGHT_MAX];
            self.sequences = vec![0; SYNCS_IN_FLIGHT_MAX * self.shard_count];
        }
        let slot = (self.head + self.pending) % SYNCS_IN_FLIGHT_MAX;
        self.starts[slot] = self.bytes.len();
        let sequences = &mut self.sequences[slot * self.shard_count..(slot + 1) * self.shard_count];
        sequences.fill(0);
        fill(sequences);
        self.pending += 1;
        write_ok(self.line(), line_number, b"SYNC", token);
    }

    /// The batch sequences the oldest pending SYNC waits for.
    fn head_sequences(&self) -> Option<&[u64]> {
        (self.pending > 0).then(|| &self.sequences[self.head * self.shard_count..(self.head + 1) * self.shard_count])
    }

    /// Answers the pending SYNCs that are answerable now, oldest first
    /// (their `OK` lines and the replies after them become writable up to
    /// the next pending SYNC). Returns how many were answered.
    pub fn answer_ready(&mut self, ingress: &Ingress) -> usize {
        let mut answered = 0;
        while let Some(sequences) = self.head_sequences() {
            let ready = sequences.iter().enumerate().all(|(owner, &sequence)| ingress.granted(owner as u16, sequence));
            if !ready {
                break;
            }
            self.head = (self.head + 1) % SYNCS_IN_FLIGHT_MAX;
            self.pending -= 1;
            answered += 1;
        }
        answered
    }

    /// Resolves once the oldest pending SYNC is answerable; never, when
    /// none is pending.
    pub async fn oldest_answerable(&self, ingress: &Ingress) {
        match self.head_sequences() {
            Some(sequences) => ingress.wait_granted(sequences).await,
            None => std::future::pending().await,
        }
    }

    /// The replies that may be written now: every byte before the oldest
    /// pending SYNC's `OK` line.
    pub fn writable(&self) -> &[u8] {
        let end = if self.pending > 0 { self.starts[self.head] } else { self.bytes.len() };
        &self.bytes[..end]
    }

    /// Drops the first `count` bytes (written or dropped), and gives back a
    /// buffer that grew past its retained size in a burst once it is empty.
    pub fn consume(&mut self, count: usize) {
        assert!(count <= self.writable().len(), "only writable bytes are consumed");
        self.bytes.drain(..count);
        for index in 0..self.pending {
            self.starts[(self.head + index) % SYNCS_IN_FLIGHT_MAX] -= count;
        }
        if self.bytes.is_empty() && self.bytes.capacity() > REPLY_BUFFER_RETAINED_BYTES {
            self.bytes = Vec::new();
        }
    }

    /// Gives every buffer back, for a connection that has been idle, when
    /// nothing is pending or unwritten.
    pub fn trim(&mut self) {
        if self.pending == 0 && self.bytes.is_empty() {
            *self = Replies::new(self.shard_count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies after a pending SYNC are held behind it; consuming the
    /// writable part keeps the pending SYNC's place.
    #[test]
    fn replies_after_a_pending_sync_wait_behind_it() {
        let mut replies = Replies::new(2);
        replies.line().extend_from_slice(b"ERR 1 x\n");
        replies.push_sync(2, b"t", |sequences| sequences[1] = 5);
        replies.line().extend_from_slice(b"ERR 3 y\n");
        assert_eq!(replies.writable(), b"ERR 1 x\n");
        replies.consume(8);
        assert_eq!(replies.writable(), b"");
        assert_eq!(replies.syncs_pending(), 1);
        assert_eq!(replies.head_sequences(), Some(&[0, 5][..]));
        // Answer it by hand (the ingress is not needed to test the ring).
        replies.head = (replies.head + 1) % SYNCS_IN_FLIGHT_MAX;
        replies.pending -= 1;
        assert_eq!(replies.writable(), b"OK 2 SYNC t\nERR 3 y\n");
    }

    /// The ring holds at most SYNCS_IN_FLIGHT_MAX and wraps around.
    #[test]
    fn the_ring_is_bounded_and_wraps() {
        let mut replies = Replies::new(1);
        for round in 0..3 * SYNCS_IN_FLIGHT_MAX as u64 {
            replies.push_sync(round, b"", |sequences| sequences[0] = round + 1);
            if replies.syncs_full() {
                assert_eq!(replies.head_sequences().unwrap()[0], round + 2 - SYNCS_IN_FLIGHT_MAX as u64);
                replies.head = (replies.head + 1) % SYNCS_IN_FLIGHT_MAX;
                replies.pending -= 1;
                let writable = replies.writable().len();
                replies.consume(writable);
            }
        }
        assert_eq!(replies.syncs_pending(), SYNCS_IN_FLIGHT_MAX - 1);
    }
}
