//! Start-up's part of the cluster: this node's identity from the data
//! directory, the cluster socket bound before any shard starts (so a busy
//! port fails the start with its name), the advertised addresses, and the
//! cluster thread ([`crate::cluster`]).

use std::net::SocketAddr;

use crate::cluster::identity::{self, MemberAddresses, MemberId, NodeIdentity};
use crate::cluster::{ClusterHandle, ClusterSetup, ReplicationSetup};
use crate::config::{Config, Storage};
use crate::replication::file_store::FileLogStore;
use crate::replication::node::ProposalRequest;
use crate::runtime::log;
use crate::serve::ServeError;
use crate::shard::control::ControlRequest;
use crate::transport::{TransportHandle, TransportSetup};

/// What start-up prepares for the cluster before the shards start.
pub struct ClusterStart {
    pub identity: NodeIdentity,
    /// The bound cluster socket; `None` for a cluster of one.
    socket: Option<std::net::UdpSocket>,
    /// The transport's listener on the same address, TCP.
    listener: Option<std::net::TcpListener>,
    pub addresses: MemberAddresses,
    /// The Raft store, read back, and the way shards propose to the groups
    /// (a clustered node only).
    replication: Option<(FileLogStore, ClusterReceivers)>,
    /// What shards hand their proposals (and readers) to.
    pub proposals: Option<ShardSenders>,
}

/// How a shard reaches the cluster thread: its proposals for replicated
/// partitions, and the replicated partitions its subscribers wait on
/// ([`crate::replication::mirror`]).
#[derive(Clone)]
pub struct ShardSenders {
    pub proposals: flume::Sender<ProposalRequest>,
    pub readers: flume::Sender<crate::replication::mirror::Reader>,
}

/// The cluster thread's ends of [`ShardSenders`].
pub struct ClusterReceivers {
    proposals: flume::Receiver<ProposalRequest>,
    readers: flume::Receiver<crate::replication::mirror::Reader>,
}

/// Reads (or creates) the node identity and binds the cluster socket.
/// Called with the data directory locked, before any shard starts.
pub fn prepare(config: &Config) -> Result<ClusterStart, ServeError> {
    let identity = identity::open(&config.data_dir, config.storage).map_err(ServeError::Identity)?;
    let Some(bind) = config.cluster_address() else {
        // A cluster of one still has addresses to show in GET /cluster;
        // it advertises its listeners as bound.
        let addresses = MemberAddresses::advertised(config, SocketAddr::from(([127, 0, 0, 1], 0)));
        return Ok(ClusterStart {
            identity,
            socket: None,
            listener: None,
            addresses,
            replication: None,
            proposals: None,
        });
    };
    let socket = bind_socket(bind)?;
    // The same port number as the gossip's (which a port 0 chose).
    let port = socket.local_addr().map_or(bind.port(), |address| address.port());
    let listener = bind_listener(SocketAddr::new(bind.ip(), port))?;
    let advertise = match config.advertise {
        Some(advertise) => advertise,
        None => {
            let (advertise, routed) = identity::default_advertise(bind, &config.join);
            if !routed {
                log::warn!(
                    "cluster: advertising {advertise} (no --advertise, --cluster is a wildcard and there is no \
                     --join to route to): only nodes on this machine can reach it; pass --advertise IP:PORT"
                );
            }
            advertise
        }
    };
    let addresses = MemberAddresses::advertised(config, advertise);
    let store = match config.storage {
        Storage::Disk => FileLogStore::open(&config.data_dir).map_err(ServeError::ReplicationStore)?,
        Storage::Memory => FileLogStore::in_memory(),
    }
    .with_entry_bytes_max(config.raft_log_bytes_max);
    let (proposals, receiver) = flume::bounded(crate::shard::replicated::proposal_queue_capacity(config.shard_count()));
    let (readers, readers_receiver) = flume::bounded(crate::replication::mirror::READERS_QUEUE_MAX);
    Ok(ClusterStart {
        identity,
        socket: Some(socket),
        listener: Some(listener),
        addresses,
        replication: Some((store, ClusterReceivers { proposals: receiver, readers: readers_receiver })),
        proposals: Some(ShardSenders { proposals, readers }),
    })
}

/// How long start-up waits for the transport's TCP port to be free: a node
/// restarted right after a kill -9 finds its old listener still held by
/// the kernel for a moment (GLOMMIO-NOTES).
const LISTENER_BIND_WAIT_MS: u64 = 5000;

/// Binds the transport's TCP listener (no `SO_REUSEPORT`, so a second node
/// on the port fails to start instead of sharing it), non-blocking for the
/// executor; waits a bounded time while the address is in use.
fn bind_listener(address: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let failed = |error| ServeError::Bind { name: "cluster (tcp)", address, error };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(LISTENER_BIND_WAIT_MS);
    let listener = loop {
        match std::net::TcpListener::bind(address) {
            Ok(listener) => break listener,
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(error) => return Err(failed(error)),
        }
    };
    listener.set_nonblocking(true).map_err(failed)?;
    Ok(listener)
}

/// Binds the cluster's UDP port without `SO_REUSEPORT` (glommio's own bind
/// sets it, and two nodes would then silently share one port), non-blocking
/// for the executor.
fn bind_socket(address: SocketAddr) -> Result<std::net::UdpSocket, ServeError> {
    let failed = |error| ServeError::Bind { name: "cluster", address, error };
    let socket = std::net::UdpSocket::bind(address).map_err(failed)?;
    socket.set_nonblocking(true).map_err(failed)?;
    Ok(socket)
}

/// Starts the cluster thread once the shards answer control requests.
pub fn start(
    config: &Config,
    prepared: ClusterStart,
    (controls, deliveries): (&[flume::Sender<ControlRequest>], &[flume::Sender<ControlRequest>]),
    streams: Vec<crate::stream::StreamSpec>,
    (catalog_applied, catalog_entries): (u64, flume::Sender<crate::replication::node::CatalogEntries>),
) -> Result<ClusterHandle, ServeError> {
    let ClusterStart { identity, socket, listener, addresses, replication, proposals: _ } = prepared;
    let replication = replication.map(|(store, receivers)| ReplicationSetup {
        store,
        proposals: receivers.proposals,
        readers: receivers.readers,
        streams,
        catalog_applied,
        catalog_entries,
        deliveries: deliveries.to_vec(),
    });
    let transport = listener.map(|listener| TransportSetup {
        node_id: identity.node_id,
        listener,
        test_flood: config.transport_test_flood,
        test_receive_us_per_kib: config.transport_test_receive_us_per_kib,
        handle: TransportHandle::new(),
    });
    let setup = ClusterSetup {
        identity: MemberId::new(identity, addresses),
        socket,
        join: config.join.clone(),
        controls: controls.to_vec(),
        transport,
        replication,
    };
    ClusterHandle::start(setup).map_err(ServeError::Executors)
}

/// The banner's cluster line.
pub fn describe(config: &Config, prepared: &ClusterStart) -> String {
    let NodeIdentity { node_id, incarnation, .. } = prepared.identity;
    match config.cluster_address() {
        None => format!("node {node_id} (incarnation {incarnation}), a cluster of one (no --join)"),
        Some(bind) => {
            let join: Vec<String> = config.join.iter().map(SocketAddr::to_string).collect();
            format!(
                "node {node_id} (incarnation {incarnation}), cluster gossip on udp and transport on tcp {bind} advertised as {}{}",
                prepared.addresses.cluster,
                if join.is_empty() { String::new() } else { format!(", joining through {}", join.join(",")) }
            )
        }
    }
}
