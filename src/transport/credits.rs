//! Credit-based flow control of one connection, and the reconnect backoff:
//! plain data, no I/O, unit-tested.
//!
//! The same scheme as the shard mesh ([`crate::routing`], `shard::grants`),
//! across machines: the receiver grants the sender a window of
//! `window_bytes` at the handshake; the sender spends a data frame's wire
//! size before writing it ([`SendCredits::try_spend`]) and never has more
//! than the window unacknowledged; the receiver counts what arrived
//! ([`ReceiveCredits::receive`], refusing a peer that overruns the window)
//! and, once a message's consumer is done with it, grants its bytes back.
//! Grants are batched like the mesh's: the consumer's releases accumulate
//! and leave in one Credit frame once they reach [`grant_threshold_bytes`]
//! (a quarter of the window). Because a frame is at most half the window
//! (`config::limits` asserts it), a sender that runs out of credit always
//! has more than a quarter of the window in flight or unreleased, so the
//! grant it waits for is never held back by the threshold.

use std::time::Duration;

/// The sender's side: the credit left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendCredits {
    available_bytes: usize,
    window_bytes: usize,
}

/// The peer sent what the protocol forbids: the connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditError {
    /// A grant would give the sender more than the window.
    GrantOverWindow { available_bytes: usize, grant_bytes: usize, window_bytes: usize },
    /// The sender sent more than the window it was granted.
    Overrun { outstanding_bytes: usize, frame_bytes: usize, window_bytes: usize },
}

impl std::fmt::Display for CreditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreditError::GrantOverWindow { available_bytes, grant_bytes, window_bytes } => write!(
                f,
                "a credit grant of {grant_bytes} bytes on {available_bytes} available passes the window of \
                 {window_bytes}"
            ),
            CreditError::Overrun { outstanding_bytes, frame_bytes, window_bytes } => write!(
                f,
                "the peer sent a frame of {frame_bytes} bytes with {outstanding_bytes} outstanding, past its \
                 window of {window_bytes}"
            ),
        }
    }
}

impl std::error::Error for CreditError {}

impl SendCredits {
    /// A fresh connection's credit: the whole window the receiver granted.
    pub fn new(window_bytes: usize) -> SendCredits {
        SendCredits { available_bytes: window_bytes, window_bytes }
    }

    pub fn available_bytes(&self) -> usize {
        self.available_bytes
    }

    /// Bytes sent and not yet granted back.
    pub fn outstanding_bytes(&self) -> usize {
        self.window_bytes - self.available_bytes
    }

    /// Spends `frame_bytes` if the credit covers them.
    pub fn try_spend(&mut self, frame_bytes: usize) -> bool {
        if frame_bytes > self.available_bytes {
            return false;
        }
        self.available_bytes -= frame_bytes;
        true
    }

    /// A Credit frame arrived.
    pub fn grant(&mut self, grant_bytes: usize) -> Result<(), CreditError> {
        let available_bytes = self.available_bytes;
        match available_bytes.checked_add(grant_bytes) {
            Some(total) if total <= self.window_bytes => {
                self.available_bytes = total;
                Ok(())
            }
            _ => Err(CreditError::GrantOverWindow { available_bytes, grant_bytes, window_bytes: self.window_bytes }),
        }
    }
}

/// The receiver's side: bytes that arrived and were not granted back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveCredits {
    outstanding_bytes: usize,
    window_bytes: usize,
}

impl ReceiveCredits {
    pub fn new(window_bytes: usize) -> ReceiveCredits {
        ReceiveCredits { outstanding_bytes: 0, window_bytes }
    }

    pub fn outstanding_bytes(&self) -> usize {
        self.outstanding_bytes
    }

    /// A data frame of `frame_bytes` arrived: an error if the sender passed
    /// its window (a bug or a hostile peer: the memory bound relies on it).
    pub fn receive(&mut self, frame_bytes: usize) -> Result<(), CreditError> {
        let outstanding_bytes = self.outstanding_bytes;
        if outstanding_bytes + frame_bytes > self.window_bytes {
            return Err(CreditError::Overrun { outstanding_bytes, frame_bytes, window_bytes: self.window_bytes });
        }
        self.outstanding_bytes += frame_bytes;
        Ok(())
    }

    /// Consumers released `bytes`: the grant to send for them (all of
    /// them; the caller batches by [`grant_threshold_bytes`]).
    pub fn release(&mut self, bytes: usize) -> u32 {
        let bytes = bytes.min(self.outstanding_bytes);
        self.outstanding_bytes -= bytes;
        bytes as u32
    }
}

/// Released bytes that make a Credit frame leave: a quarter of the window.
pub const fn grant_threshold_bytes(window_bytes: usize) -> usize {
    window_bytes / 4
}

/// The delay before the next connection attempt after `failures` failed
/// ones in a row: [`BACKOFF_BASE_MS`] doubled each time, capped at
/// [`BACKOFF_MAX_MS`], then scaled by `jitter` (0.5..=1.0 from the caller's
/// randomness, so peers that lost a node at once do not redial in step).
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    let doubled = BACKOFF_BASE_MS.saturating_mul(1u64 << failures.min(20));
    let capped = doubled.min(BACKOFF_MAX_MS) as f64;
    Duration::from_millis((capped * jitter.clamp(0.5, 1.0)) as u64)
}

/// The first reconnect delay, in ms.
pub const BACKOFF_BASE_MS: u64 = 50;
/// The longest reconnect delay, in ms: a node that comes back is dialed
/// within this (plus the connect timeout).
pub const BACKOFF_MAX_MS: u64 = 2000;

#[cfg(test)]
mod tests {
    use super::*;

    /// The sender never has more than the window outstanding: spending
    /// stops at the window, grants bring it back, and a grant past the
    /// window is a protocol error.
    #[test]
    fn the_sender_stays_within_the_window() {
        let mut credits = SendCredits::new(1000);
        assert!(credits.try_spend(600));
        assert!(!credits.try_spend(401), "past the window");
        assert!(credits.try_spend(400));
        assert_eq!((credits.available_bytes(), credits.outstanding_bytes()), (0, 1000));
        assert!(!credits.try_spend(1));
        credits.grant(250).unwrap();
        assert!(credits.try_spend(250));
        credits.grant(1000).unwrap();
        assert!(matches!(credits.grant(1), Err(CreditError::GrantOverWindow { .. })));
        assert!(credits.grant(usize::MAX).is_err(), "no overflow");
    }

    /// The receiver refuses a sender that passes its window, and grants
    /// back at most what is outstanding.
    #[test]
    fn the_receiver_refuses_an_overrun() {
        let mut credits = ReceiveCredits::new(1000);
        credits.receive(700).unwrap();
        let error = credits.receive(301).unwrap_err();
        assert!(error.to_string().contains("past its window of 1000"), "{error}");
        credits.receive(300).unwrap();
        assert_eq!(credits.release(400), 400);
        assert_eq!(credits.outstanding_bytes(), 600);
        assert_eq!(credits.release(10_000), 600, "never more than outstanding");
    }

    /// A sender and a receiver that pass frames and batched grants between
    /// them never disagree: what the sender has outstanding is what the
    /// receiver holds plus what it released and has not granted yet, and a
    /// sender out of credit always leaves the receiver a grant to send.
    #[test]
    fn batched_grants_never_deadlock() {
        let window = 4096;
        let (mut sender, mut receiver) = (SendCredits::new(window), ReceiveCredits::new(window));
        let (mut unreleased, mut released) = (std::collections::VecDeque::new(), 0usize);
        let mut state = 12345u64;
        for _ in 0..100_000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let frame = 6 + (state >> 33) as usize % (window / 2 - 6);
            if sender.try_spend(frame) {
                receiver.receive(frame).unwrap();
                unreleased.push_back(frame);
            } else if let Some(oldest) = unreleased.pop_front() {
                released += oldest;
            } else {
                assert!(released >= grant_threshold_bytes(window), "stuck: nothing to release, grant held");
            }
            if released >= grant_threshold_bytes(window) {
                sender.grant(receiver.release(released) as usize).unwrap();
                released = 0;
            }
            let held: usize = unreleased.iter().sum::<usize>() + released;
            assert_eq!(sender.outstanding_bytes(), held);
        }
    }

    /// The backoff doubles from its base up to its cap, and jitter only
    /// shortens it by up to half.
    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let delays: Vec<u64> = (0..8).map(|failures| backoff_delay(failures, 1.0).as_millis() as u64).collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff_delay(u32::MAX, 1.0), Duration::from_millis(BACKOFF_MAX_MS));
        assert_eq!(backoff_delay(0, 0.0), Duration::from_millis(25));
    }
}
