//! Replicated partitions: every (stream, partition) is a Raft group.
//!
//! - [`placement`]: where a group's replicas should live (weighted
//!   rendezvous hashing over the live members).

pub mod frame;
pub mod host;
pub mod placement;
pub mod reconfig;
pub mod sim;
pub mod store;
pub mod wire;

use crate::cluster::NodeId;

/// A node as a Raft peer: raft-rs names peers by a non-zero `u64`, derived
/// from the node's 128-bit [`NodeId`] by [`replica_id_of`].
pub type ReplicaId = u64;

/// One Raft group: a (stream, partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId {
    pub stream_id: u32,
    pub partition: u32,
}

/// The Raft peer id of a node: the xor of its id's halves, or 1 if that is
/// 0 (raft-rs reserves 0 for "none"). Two nodes colliding needs equal
/// halves-xor of random 128-bit ids (2^-64); a node refusing a member with
/// its own replica id is the wiring's job.
pub fn replica_id_of(node_id: NodeId) -> ReplicaId {
    let folded = (node_id.0 as u64) ^ ((node_id.0 >> 64) as u64);
    if folded == 0 { 1 } else { folded }
}
