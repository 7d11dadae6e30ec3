//! Several spate nodes as one cluster, with no coordinator: who is a
//! member, whether it is alive, where to reach it and how loaded it is.
//!
//! What exists now is membership and load gossip, and the internode
//! transport ([`crate::transport`], run by the cluster thread, one link per
//! member); replication (a Raft group per partition), placement and
//! forwarding come next and build on the names defined here: a node is its [`NodeId`] (kept in the data
//! directory), a member's [`MemberAddresses`] say where its services and
//! its internode port are, and [`ClusterView`] is the membership any node
//! sees.
//!
//! - [`identity`]: the node id and incarnation kept in `--data-dir`, the
//!   addresses a member advertises, and the identity foca gossips.
//! - [`membership`]: foca's SWIM membership as a sans-IO state machine
//!   (timers, datagrams and load broadcasts in, datagrams out); its doc
//!   gives the failure-detection bound and every buffer's limit.
//! - [`load`]: the load summary each member publishes as a foca custom
//!   broadcast, and the table of everyone's latest.
//! - `driver` (private to the crate): the cluster thread that runs the
//!   membership over a UDP socket and the real clock.
//! - [`sim`]: the same membership over an in-memory network and a
//!   simulated clock, from a seed: the seed of the cluster simulator.
//!
//! A node joins with `spate serve --join SEED_ADDR` (binding `--cluster`,
//! default `0.0.0.0:9404`, for UDP gossip and the TCP transport); a node with neither `--join`
//! nor `--cluster` is a cluster of one that binds no extra port and
//! gossips nothing (README, "Cluster").
//!
//! ```
//! use std::time::Duration;
//! use spate::cluster::sim::{SimConfig, Simulation};
//! let mut simulation = Simulation::new(SimConfig { nodes: 3, seed: 7, ..SimConfig::default() });
//! simulation.run_for(Duration::from_secs(5));
//! assert!(simulation.converged());
//! ```

pub(crate) mod driver;
pub mod identity;
pub mod load;
pub mod membership;
pub(crate) mod rng;
pub(crate) mod scheduled;
pub mod sim;

pub(crate) use driver::{ClusterHandle, ClusterRequest, ClusterSetup, ClusterView, ReplicationSetup};
pub use identity::{MemberAddresses, MemberId, NodeId, NodeIdentity};
pub use membership::{MemberState, MemberView, Membership};

/// Members a node keeps track of at most (the memory formula counts
/// [`CLUSTER_MEMBER_BYTES`](crate::config::CLUSTER_MEMBER_BYTES) each).
pub use crate::config::CLUSTER_MEMBERS_MAX as MEMBERS_MAX;
