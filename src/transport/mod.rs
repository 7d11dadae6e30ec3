//! Node-to-node links: framed, batched TCP with credit-based flow control,
//! on the cluster address's port number (TCP beside the UDP gossip).
//!
//! - [`codec`]: the frames (length-prefixed; handshake, data, credit), pure
//!   and fuzzed.
//! - [`credits`]: the window a receiver grants and the sender spends, the
//!   batched grants, the reconnect backoff; pure.
//! - [`queue`]: the byte-bounded queue of one peer that any thread pushes
//!   to; where backpressure reaches the caller.
//! - [`runtime`]: the listener, one outbound connection per peer
//!   with reconnect, the inbound connections, the ping, the counters.
//!
//! **Where it runs: the cluster thread.** The transport shares the cluster
//! thread's executor with the membership (one unpinned thread), not one
//! connection per shard: per-shard links would make `S * S` connections per
//! node pair, split every node pair's traffic into `S` windows (`S` times
//! the memory for the same bandwidth), and scatter the Raft heartbeats of a
//! node pair that the replication layer must coalesce into one message per
//! tick. A shard sends through a [`TransportHandle`] (`Send + Clone`): the
//! message goes into the peer's [`queue::PeerQueue`] (a mutex held for a
//! push) and the transport thread writes it. The cost is one hand-off per
//! message between the shard and the transport thread (a wake-up of that
//! thread, an eventfd write, only when its writer was idle) and one copy of
//! the payload into the socket's write buffer; callers should therefore
//! send batches (a forwarded batch, a tick's Raft messages), never one
//! event per message. One thread also bounds the transport to about one
//! core's worth of copying (several GB/s on loopback, measured in the
//! README), far above what a node's disk or a 10 GbE link takes.
//!
//! **Flow control.** Each connection carries data one way (from its
//! dialer); the receiver grants [`TRANSPORT_WINDOW_BYTES`] at the handshake
//! and grants bytes back as its consumers release messages
//! ([`Inbound`] holds its credit until dropped). A sender without credit
//! stops writing; its queue fills to [`TRANSPORT_QUEUE_BYTES_MAX`]; then
//! every caller's `send` waits. So a slow node pushes back on the callers
//! of every node that sends to it, and no buffer grows: per peer, memory is
//! at most [`TRANSPORT_PEER_BYTES`], for at most [`TRANSPORT_PEERS_MAX`]
//! peers (the memory formula's transport line).
//!
//! **Failures.** A connection that drops is redialed with exponential
//! backoff ([`credits::backoff_delay`], 50 ms doubling to 2 s, jittered).
//! Messages queued while it redials stay queued; once an attempt fails the
//! peer is unreachable: its queue is dropped (counted) and every send fails
//! with [`SendError::Unreachable`] until a connection succeeds. Delivery is
//! FIFO per peer and at most once: frames written to a connection that then
//! drops may be lost, which the layers above absorb (Raft retransmits,
//! forwarded batches are retried and deduplicated by sequence).
//!
//! [`TRANSPORT_WINDOW_BYTES`]: crate::config::TRANSPORT_WINDOW_BYTES
//! [`TRANSPORT_QUEUE_BYTES_MAX`]: crate::config::TRANSPORT_QUEUE_BYTES_MAX
//! [`TRANSPORT_PEER_BYTES`]: crate::config::TRANSPORT_PEER_BYTES
//! [`TRANSPORT_PEERS_MAX`]: crate::config::TRANSPORT_PEERS_MAX

pub mod codec;
pub mod credits;
pub mod queue;
pub mod runtime;

pub use queue::{LinkState, SendError};
pub use runtime::{Inbound, PeerView, Transport, TransportHandle, TransportSetup};

/// What a message is for: the receiver hands it to that channel's consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Channel {
    /// A round-trip probe (sequence and send time), answered with a pong.
    Ping = 1,
    Pong = 2,
    /// Filler for tests and measurements (`--transport-test-flood`).
    Bulk = 3,
    /// A [`crate::replication::wire::PeerBatch`]: one round's Raft messages
    /// of every group between two nodes.
    Raft = 4,
    /// A proposal forwarded to its group's leader
    /// ([`crate::replication::node`]).
    Propose = 5,
    /// A forwarded proposal committed: the leader tells the proposing node
    /// (group, source sequence), so a proposer that holds no replica of the
    /// group (any more) is answered too ([`crate::replication::node`]).
    ProposeAck = 6,
    /// A forwarded proposal the receiving node did not take (not the
    /// leader, leadership in transfer, its Raft log full): it tells the
    /// proposing node (group, source sequence) at once, and refuses every
    /// later proposal of that node for the group until one comes as
    /// [`Channel::ProposeAfterRefusal`], so no later batch overtakes the
    /// refused one ([`crate::replication::node`], "Refused forwards").
    ProposeRefused = 7,
    /// A [`Channel::Propose`], the first of its group from this node since
    /// a refusal: the leader takes proposals of the group from it again.
    ProposeAfterRefusal = 8,
    /// A replica's request for records its partition lacks before its
    /// group's compaction point (a gap): a range of a peer's partition log
    /// ([`crate::replication::catchup`]).
    GapRead = 9,
    /// The answer to a [`Channel::GapRead`]: a bounded chunk of records, or
    /// why not ([`crate::replication::catchup`]).
    GapRecords = 10,
    /// A node's long poll for a partition of which it holds no replica
    /// and a local subscriber reads: the records of a peer's partition log
    /// from an offset on ([`crate::replication::mirror`]).
    MirrorRead = 11,
    /// The answer to a [`Channel::MirrorRead`], encoded as a
    /// [`Channel::GapRecords`].
    MirrorRecords = 12,
    /// A [`Channel::Propose`] sent again, with the same header, after its
    /// leader changed or its answer was long in coming: a leader whose log
    /// holds it does not store it twice ([`crate::replication::node`],
    /// "Retries").
    ProposeRetry = 13,
}

impl Channel {
    pub fn from_u8(value: u8) -> Option<Channel> {
        match value {
            1 => Some(Channel::Ping),
            2 => Some(Channel::Pong),
            3 => Some(Channel::Bulk),
            4 => Some(Channel::Raft),
            5 => Some(Channel::Propose),
            6 => Some(Channel::ProposeAck),
            7 => Some(Channel::ProposeRefused),
            8 => Some(Channel::ProposeAfterRefusal),
            9 => Some(Channel::GapRead),
            10 => Some(Channel::GapRecords),
            11 => Some(Channel::MirrorRead),
            12 => Some(Channel::MirrorRecords),
            13 => Some(Channel::ProposeRetry),
            _ => None,
        }
    }
}
