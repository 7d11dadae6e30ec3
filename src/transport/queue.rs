//! The messages waiting for one peer: a byte-bounded queue that any thread
//! may push to and the transport thread drains ([`PeerQueue`]).
//!
//! A sender whose message does not fit waits ([`PeerQueue::push`]): that is
//! where a slow peer's backpressure reaches the caller (a shard's task, and
//! through it the producer's socket). While the peer is unreachable (its
//! last connection attempt failed), a push fails at once with
//! [`SendError::Unreachable`], waiting senders are woken to fail the same
//! way, and what was queued is dropped and counted: the caller learns, and
//! nothing piles up for a node that may never come back.
//!
//! The lock is held only to move a message in or out (no I/O under it), so
//! shards never contend with the transport thread for longer than that.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Mutex;
use std::task::{Poll, Waker};

use bytes::Bytes;

use crate::cluster::identity::NodeId;
use crate::transport::codec::{PAYLOAD_BYTES_MAX, data_frame_bytes};

/// One message for a peer.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub channel: u8,
    pub payload: Bytes,
}

impl Outgoing {
    /// What the message costs in queue space and credits: its frame.
    pub fn frame_bytes(&self) -> usize {
        data_frame_bytes(self.payload.len())
    }
}

/// Whether a peer can be sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    /// Dialing (first time, or again after a drop): messages queue.
    Connecting,
    /// Connected: messages flow as credits allow.
    Connected,
    /// The last connection attempt failed: sends fail at once.
    Unreachable,
    /// No longer a member (down, left): sends fail at once.
    Removed,
}

/// Why a message was not queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The peer cannot be reached now (its last connection attempt failed,
    /// `failures` in a row); try again later.
    Unreachable { peer: NodeId, failures: u32 },
    /// The peer is not (or no longer) a member this node sends to.
    UnknownPeer { peer: NodeId },
    /// The payload is over [`PAYLOAD_BYTES_MAX`].
    TooLarge { payload_bytes: usize, payload_bytes_max: usize },
    /// `try_send` only: the queue is full (the async send would wait).
    Full { peer: NodeId },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Unreachable { peer, failures } => {
                write!(f, "node {peer} is unreachable ({failures} connection attempts failed in a row)")
            }
            SendError::UnknownPeer { peer } => write!(f, "node {peer} is not a live member"),
            SendError::TooLarge { payload_bytes, payload_bytes_max } => {
                write!(f, "a message of {payload_bytes} bytes is over the limit of {payload_bytes_max}")
            }
            SendError::Full { peer } => write!(f, "the queue to node {peer} is full"),
        }
    }
}

impl std::error::Error for SendError {}

/// What a queue counts (shown per peer in `/cluster` and `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    pub messages_queued: u64,
    /// Pushes that had to wait for room: the peer pushed back.
    pub sender_waits: u64,
    /// Messages dropped because the peer became unreachable or left.
    pub messages_dropped: u64,
    pub queued_bytes: usize,
}

struct QueueState {
    messages: VecDeque<Outgoing>,
    queued_bytes: usize,
    link: LinkState,
    failures: u32,
    /// Bumped by every push and state change: the writer sleeps until it
    /// moves.
    generation: u64,
    writer: Option<Waker>,
    /// Senders waiting for room (each re-registers on every poll; the list
    /// is cleared on every wake-up, so it holds one entry per waiting task).
    senders: Vec<Waker>,
    counters: QueueCounters,
}

/// The queue of one peer, shared by every thread that sends to it.
pub struct PeerQueue {
    peer: NodeId,
    bytes_max: usize,
    state: Mutex<QueueState>,
}

impl PeerQueue {
    pub fn new(peer: NodeId, bytes_max: usize) -> PeerQueue {
        let state = QueueState {
            messages: VecDeque::new(),
            queued_bytes: 0,
            link: LinkState::Connecting,
            failures: 0,
            generation: 0,
            writer: None,
            senders: Vec::new(),
            counters: QueueCounters::default(),
        };
        PeerQueue { peer, bytes_max, state: Mutex::new(state) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic under this lock left plain data behind: keep using it.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `message` if there is room now.
    pub fn try_push(&self, message: Outgoing) -> Result<(), SendError> {
        match self.offer(message) {
            Ok(()) => Ok(()),
            Err(Some(error)) => Err(error),
            Err(None) => Err(SendError::Full { peer: self.peer }),
        }
    }

    /// Queues `message`, waiting for room (the peer's backpressure).
    pub async fn push(&self, message: Outgoing) -> Result<(), SendError> {
        let mut message = Some(message);
        let mut waited = false;
        poll_fn(|cx| {
            let Some(pending) = message.take() else { return Poll::Ready(Ok(())) };
            match self.offer_or_wait(pending, cx.waker(), &mut waited) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(Ok(back)) => {
                    message = Some(back);
                    Poll::Pending
                }
                Err(Err(error)) => Poll::Ready(Err(error)),
            }
        })
        .await
    }

    /// Queues, or keeps the message and registers `waker` for room.
    fn offer_or_wait(
        &self,
        message: Outgoing,
        waker: &Waker,
        waited: &mut bool,
    ) -> Result<(), Result<Outgoing, SendError>> {
        let mut state = self.lock();
        if let Some(error) = self.refusal(&state, &message) {
            return Err(Err(error));
        }
        if state.queued_bytes + message.frame_bytes() > self.bytes_max {
            if !*waited {
                *waited = true;
                state.counters.sender_waits += 1;
            }
            state.senders.push(waker.clone());
            return Err(Ok(message));
        }
        Self::enqueue(&mut state, message);
        Ok(())
    }

    /// Queues if there is room; `Err(None)`: full.
    fn offer(&self, message: Outgoing) -> Result<(), Option<SendError>> {
        let mut state = self.lock();
        if let Some(error) = self.refusal(&state, &message) {
            return Err(Some(error));
        }
        if state.queued_bytes + message.frame_bytes() > self.bytes_max {
            return Err(None);
        }
        Self::enqueue(&mut state, message);
        Ok(())
    }

    fn refusal(&self, state: &QueueState, message: &Outgoing) -> Option<SendError> {
        if message.payload.len() > PAYLOAD_BYTES_MAX {
            let payload_bytes = message.payload.len();
            return Some(SendError::TooLarge { payload_bytes, payload_bytes_max: PAYLOAD_BYTES_MAX });
        }
        match state.link {
            LinkState::Unreachable => Some(SendError::Unreachable { peer: self.peer, failures: state.failures }),
            LinkState::Removed => Some(SendError::UnknownPeer { peer: self.peer }),
            LinkState::Connecting | LinkState::Connected => None,
        }
    }

    fn enqueue(state: &mut QueueState, message: Outgoing) {
        state.queued_bytes += message.frame_bytes();
        state.messages.push_back(message);
        state.counters.messages_queued += 1;
        state.generation += 1;
        if let Some(writer) = state.writer.take() {
            writer.wake();
        }
    }

    /// The transport thread's side: moves messages into `out` (encoded)
    /// while `take` accepts each one's frame size (it spends credits), up
    /// to `out` reaching `flush_bytes`; returns the messages moved, the
    /// generation seen, and whether `take` refused the next message (the
    /// writer is out of credit).
    pub fn drain_into(
        &self,
        out: &mut Vec<u8>,
        flush_bytes: usize,
        mut take: impl FnMut(usize) -> bool,
    ) -> (usize, u64, bool) {
        let mut state = self.lock();
        let mut moved = 0;
        let mut blocked = false;
        while out.len() < flush_bytes {
            let Some(head) = state.messages.front() else { break };
            let frame_bytes = head.frame_bytes();
            if !take(frame_bytes) {
                blocked = true;
                break;
            }
            let Some(message) = state.messages.pop_front() else { break };
            crate::transport::codec::encode_data(out, message.channel, &message.payload);
            state.queued_bytes -= frame_bytes;
            moved += 1;
        }
        if moved > 0 {
            for sender in state.senders.drain(..) {
                sender.wake();
            }
        }
        (moved, state.generation, blocked)
    }

    /// Waits until the queue changed since `generation` (a push, a state
    /// change).
    pub async fn changed_since(&self, generation: u64) {
        poll_fn(|cx| {
            let mut state = self.lock();
            if state.generation != generation {
                return Poll::Ready(());
            }
            state.writer = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Sets the link's state; an unreachable or removed peer's queue is
    /// dropped (counted) and every waiting sender woken to fail.
    pub fn set_link(&self, link: LinkState, failures: u32) {
        let mut state = self.lock();
        state.link = link;
        state.failures = failures;
        if matches!(link, LinkState::Unreachable | LinkState::Removed) {
            state.counters.messages_dropped += state.messages.len() as u64;
            state.messages.clear();
            state.queued_bytes = 0;
        }
        state.generation += 1;
        for sender in state.senders.drain(..) {
            sender.wake();
        }
        if let Some(writer) = state.writer.take() {
            writer.wake();
        }
    }

    pub fn link(&self) -> LinkState {
        self.lock().link
    }

    pub fn counters(&self) -> QueueCounters {
        let state = self.lock();
        QueueCounters { queued_bytes: state.queued_bytes, ..state.counters }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(bytes: usize) -> Outgoing {
        Outgoing { channel: 1, payload: Bytes::from(vec![7u8; bytes]) }
    }

    /// The queue holds at most its bytes: a push past it reports Full (or
    /// waits), and draining makes room again.
    #[test]
    fn the_queue_is_bounded_in_bytes() {
        let queue = PeerQueue::new(NodeId(1), 3 * data_frame_bytes(100));
        for _ in 0..3 {
            queue.try_push(message(100)).unwrap();
        }
        assert_eq!(queue.try_push(message(1)), Err(SendError::Full { peer: NodeId(1) }));
        let mut out = Vec::new();
        let (moved, _, _) = queue.drain_into(&mut out, usize::MAX, |_| true);
        assert_eq!((moved, out.len()), (3, 3 * data_frame_bytes(100)));
        queue.try_push(message(1)).unwrap();
        let too_large = queue.try_push(message(PAYLOAD_BYTES_MAX + 1)).unwrap_err();
        assert!(matches!(too_large, SendError::TooLarge { .. }));
    }

    /// Draining stops where the credit does, and at the flush size.
    #[test]
    fn draining_spends_credit_and_stops_at_the_flush_size() {
        let queue = PeerQueue::new(NodeId(1), 1 << 20);
        for _ in 0..10 {
            queue.try_push(message(94)).unwrap();
        }
        let mut credit = 250;
        let mut out = Vec::new();
        let (moved, _, blocked) = queue.drain_into(&mut out, usize::MAX, |bytes| {
            let fits = bytes <= credit;
            credit -= if fits { bytes } else { 0 };
            fits
        });
        assert_eq!((moved, blocked), (2, true), "two frames of 100 bytes fit 250 bytes of credit");
        out.clear();
        let (moved, _, _) = queue.drain_into(&mut out, 300, |_| true);
        assert_eq!(moved, 3, "up to the flush size, then stop");
        assert_eq!(queue.counters().queued_bytes, 5 * 100);
    }

    /// A sender waiting for room fails with Unreachable when the peer
    /// becomes unreachable, the queue is dropped and counted, and later
    /// sends fail at once.
    #[test]
    fn an_unreachable_peer_fails_its_senders() {
        let queue = std::sync::Arc::new(PeerQueue::new(NodeId(5), data_frame_bytes(10)));
        queue.try_push(message(10)).unwrap();
        let waiting = {
            let queue = queue.clone();
            std::thread::spawn(move || futures_lite::future::block_on(queue.push(message(10))))
        };
        while queue.counters().sender_waits == 0 {
            std::thread::yield_now();
        }
        queue.set_link(LinkState::Unreachable, 3);
        assert_eq!(waiting.join().unwrap(), Err(SendError::Unreachable { peer: NodeId(5), failures: 3 }));
        assert_eq!(queue.counters().messages_dropped, 1);
        assert!(matches!(queue.try_push(message(1)), Err(SendError::Unreachable { .. })));
        queue.set_link(LinkState::Connecting, 0);
        queue.try_push(message(1)).unwrap();
    }

    /// A waiting sender proceeds once the transport drains the queue.
    #[test]
    fn a_waiting_sender_proceeds_after_a_drain() {
        let queue = std::sync::Arc::new(PeerQueue::new(NodeId(5), data_frame_bytes(10)));
        queue.try_push(message(10)).unwrap();
        let waiting = {
            let queue = queue.clone();
            std::thread::spawn(move || futures_lite::future::block_on(queue.push(message(10))))
        };
        while queue.counters().sender_waits == 0 {
            std::thread::yield_now();
        }
        queue.drain_into(&mut Vec::new(), usize::MAX, |_| true);
        assert_eq!(waiting.join().unwrap(), Ok(()));
        assert_eq!(queue.counters().messages_queued, 2);
    }
}
