//! Who a node is: its [`NodeId`], created once and kept in the data
//! directory, the incarnation that grows with every start, and the
//! addresses other nodes reach it on ([`MemberId`], the identity foca
//! gossips).
//!
//! ```text
//! <data-dir>/node.json   {"node_id": "<32 hex digits>", "incarnation": 7}
//! ```
//!
//! The node id is what the Raft groups of the replication layer will name
//! their replicas by, so it must outlive restarts as long as the node's log
//! does: with `--storage disk` it is written durably
//! ([`replace_durably`](crate::storage::durable::replace_durably)) the first
//! time and read back on every start, which also bumps and saves the
//! incarnation. With `--storage memory` a restarted node remembers no
//! event, so it must not come back under the name of a replica that had
//! some: it takes a fresh id on every start (incarnation 1) and writes
//! nothing.
//!
//! foca tells two identities of one member apart by their address
//! ([`foca::Identity::addr`]: the cluster address); when two identities
//! claim one address, the one that started later wins (then the higher
//! incarnation), so a restarted node replaces its old self, even when its
//! data directory was wiped and its id is new.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Config, Storage};
use crate::storage::durable::{ReplaceError, replace_durably};

/// The identity file's name in the data directory.
pub const IDENTITY_FILE_NAME: &str = "node.json";
/// Largest identity file read, in bytes (it holds about 70).
const IDENTITY_FILE_BYTES_MAX: u64 = 4096;

/// A node's name in the cluster: 128 random bits, printed as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u128);

impl NodeId {
    /// A fresh random id (from the operating system's generator).
    pub fn random() -> NodeId {
        NodeId(rand::random::<u128>())
    }

    /// Parses 32 hex digits.
    pub fn parse(text: &str) -> Option<NodeId> {
        if text.len() != 32 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(text, 16).ok().map(NodeId)
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::fmt::Debug for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeId({self})")
    }
}

/// This node's identity for this run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeIdentity {
    pub node_id: NodeId,
    /// 1 on the first start, one more on every start after it (disk storage).
    pub incarnation: u64,
    /// Wall-clock start time, ms since the Unix epoch: breaks the tie
    /// between two identities claiming one cluster address.
    pub started_unix_ms: u64,
}

/// Why the identity could not be read or saved.
#[derive(Debug)]
pub enum IdentityError {
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file exists but does not hold an identity: refusing beats
    /// silently becoming another node.
    Corrupt {
        path: PathBuf,
        reason: String,
    },
    Write(ReplaceError),
}

impl std::fmt::Display for IdentityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdentityError::Read { path, source } => {
                write!(f, "cannot read the node identity {}: {source}", path.display())
            }
            IdentityError::Corrupt { path, reason } => write!(
                f,
                "the node identity {} is not valid ({reason}); restore it from a backup, or delete it to make this \
                 a new node (its replicas elsewhere will then treat it as a stranger)",
                path.display()
            ),
            IdentityError::Write(error) => write!(f, "cannot save the node identity: {error}"),
        }
    }
}

impl std::error::Error for IdentityError {}

/// What the identity file holds.
#[derive(Serialize, Deserialize)]
struct IdentityFile {
    node_id: String,
    incarnation: u64,
}

/// This node's identity for this run: read from (and saved back to, one
/// incarnation higher) the data directory with disk storage, fresh with
/// memory storage (see the module doc). The data directory must exist.
pub fn open(data_dir: &Path, storage: Storage) -> Result<NodeIdentity, IdentityError> {
    let started_unix_ms = unix_ms_now();
    if storage == Storage::Memory {
        return Ok(NodeIdentity { node_id: NodeId::random(), incarnation: 1, started_unix_ms });
    }
    let path = data_dir.join(IDENTITY_FILE_NAME);
    let (node_id, incarnation) = match read_identity_file(&path)? {
        Some(stored) => (stored.0, stored.1.saturating_add(1)),
        None => (NodeId::random(), 1),
    };
    let file = IdentityFile { node_id: node_id.to_string(), incarnation };
    let mut bytes = serde_json::to_vec(&file)
        .map_err(|error| IdentityError::Corrupt { path: path.clone(), reason: error.to_string() })?;
    bytes.push(b'\n');
    match replace_durably(&path, &bytes) {
        Ok(()) => {}
        // A full disk must not keep the node from starting read-only (its
        // partitions serve what they hold): this run uses the identity
        // unsaved, and the next start counts from the saved one again,
        // which the start time breaks ties on (see the module doc).
        Err(error) if error.is_storage_full() => {
            crate::runtime::log::warn!("cannot save the node identity ({error}): running with it unsaved");
        }
        Err(error) => return Err(IdentityError::Write(error)),
    }
    Ok(NodeIdentity { node_id, incarnation, started_unix_ms })
}

/// The stored id and incarnation, `None` when there is no file yet.
fn read_identity_file(path: &Path) -> Result<Option<(NodeId, u64)>, IdentityError> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(IdentityError::Read { path: path.to_path_buf(), source }),
    };
    let mut text = String::new();
    file.take(IDENTITY_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|source| IdentityError::Read { path: path.to_path_buf(), source })?;
    let corrupt = |reason: String| IdentityError::Corrupt { path: path.to_path_buf(), reason };
    let stored: IdentityFile = serde_json::from_str(&text).map_err(|error| corrupt(error.to_string()))?;
    let node_id = NodeId::parse(&stored.node_id).ok_or_else(|| corrupt("node_id is not 32 hex digits".into()))?;
    Ok(Some((node_id, stored.incarnation)))
}

fn unix_ms_now() -> u64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

/// Where other nodes and clients reach a member: what the forwarding path
/// (ingest on any node) and the Raft transport will dial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberAddresses {
    /// Node-to-node traffic: gossip over UDP and the internode transport
    /// over TCP, on the same port number.
    pub cluster: SocketAddr,
    pub ingest: SocketAddr,
    pub ingest_json: Option<SocketAddr>,
    pub ingest_ilp: Option<SocketAddr>,
    pub subscribe: SocketAddr,
    pub admin: SocketAddr,
}

impl MemberAddresses {
    /// This node's addresses as others should use them: a listener bound to
    /// a wildcard IP (`0.0.0.0`) is advertised on `advertise`'s IP.
    pub fn advertised(config: &Config, advertise: SocketAddr) -> MemberAddresses {
        let reachable = |address: SocketAddr| {
            if address.ip().is_unspecified() { SocketAddr::new(advertise.ip(), address.port()) } else { address }
        };
        MemberAddresses {
            cluster: advertise,
            ingest: reachable(config.ingest),
            ingest_json: config.ingest_json.0.map(reachable),
            ingest_ilp: config.ingest_ilp.0.map(reachable),
            subscribe: reachable(config.subscribe),
            admin: reachable(config.admin),
        }
    }
}

/// A member's identity as foca gossips it: who, which run, where.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberId {
    pub node_id: NodeId,
    pub incarnation: u64,
    pub started_unix_ms: u64,
    pub addresses: MemberAddresses,
}

impl MemberId {
    pub fn new(identity: NodeIdentity, addresses: MemberAddresses) -> MemberId {
        MemberId {
            node_id: identity.node_id,
            incarnation: identity.incarnation,
            started_unix_ms: identity.started_unix_ms,
            addresses,
        }
    }

    /// A stand-in for a `--join` address whose member is not known yet:
    /// foca accepts an announce addressed to any identity with the
    /// receiver's cluster address, so this is only ever a destination.
    pub fn seed(cluster: SocketAddr) -> MemberId {
        let addresses = MemberAddresses {
            cluster,
            ingest: cluster,
            ingest_json: None,
            ingest_ilp: None,
            subscribe: cluster,
            admin: cluster,
        };
        MemberId { node_id: NodeId(0), incarnation: 0, started_unix_ms: 0, addresses }
    }

    /// The order that decides which of two identities of one address wins.
    fn rank(&self) -> (u64, u64, NodeId) {
        (self.started_unix_ms, self.incarnation, self.node_id)
    }
}

impl std::fmt::Debug for MemberId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}@{}", self.node_id, self.incarnation, self.addresses.cluster)
    }
}

impl foca::Identity for MemberId {
    type Addr = SocketAddr;

    /// Declared down by the others while alive (a long pause, a cut link):
    /// rejoin at once as the next incarnation instead of staying out.
    fn renew(&self) -> Option<Self> {
        Some(MemberId { incarnation: self.incarnation.saturating_add(1), ..self.clone() })
    }

    fn addr(&self) -> SocketAddr {
        self.addresses.cluster
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.rank() > adversary.rank()
    }
}

/// The cluster address to advertise when `--advertise` is not given: the
/// `--cluster` address when its IP is specific; else, with `--join`, the
/// local IP the kernel routes to the first seed (a UDP `connect` sends
/// nothing); else loopback, which only a cluster on one machine can reach
/// (the caller warns).
pub fn default_advertise(cluster: SocketAddr, join: &[SocketAddr]) -> (SocketAddr, bool) {
    if !cluster.ip().is_unspecified() {
        return (cluster, true);
    }
    let routed = join.first().and_then(|seed| {
        let probe = std::net::UdpSocket::bind(SocketAddr::new(unspecified_like(seed.ip()), 0)).ok()?;
        probe.connect(seed).ok()?;
        probe.local_addr().ok().map(|local| local.ip())
    });
    match routed {
        Some(ip) => (SocketAddr::new(ip, cluster.port()), true),
        None => (SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), cluster.port()), false),
    }
}

fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use foca::Identity;

    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spate-identity-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// With disk storage the id is created once and kept, and every start
    /// is one incarnation higher than the last.
    #[test]
    fn disk_identity_is_kept_and_its_incarnation_grows() {
        let dir = scratch_dir("kept");
        let first = open(&dir, Storage::Disk).unwrap();
        let second = open(&dir, Storage::Disk).unwrap();
        let third = open(&dir, Storage::Disk).unwrap();
        assert_eq!(first.node_id, second.node_id);
        assert_eq!(second.node_id, third.node_id);
        assert_eq!((first.incarnation, second.incarnation, third.incarnation), (1, 2, 3));
        let stored = std::fs::read_to_string(dir.join(IDENTITY_FILE_NAME)).unwrap();
        assert!(stored.contains(&first.node_id.to_string()), "{stored}");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(names, [IDENTITY_FILE_NAME], "no temporary file is left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A memory node remembers nothing, so it is a new node on every start
    /// and leaves no file behind.
    #[test]
    fn memory_identity_is_fresh_every_start() {
        let dir = scratch_dir("memory");
        let first = open(&dir, Storage::Memory).unwrap();
        let second = open(&dir, Storage::Memory).unwrap();
        assert_ne!(first.node_id, second.node_id);
        assert_eq!(second.incarnation, 1);
        assert!(!dir.join(IDENTITY_FILE_NAME).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A damaged identity file stops the start with a reason instead of
    /// making the node someone else.
    #[test]
    fn corrupt_identity_is_refused() {
        let dir = scratch_dir("corrupt");
        for content in ["not json", r#"{"node_id": "xyz", "incarnation": 1}"#, r#"{"node_id": 5}"#] {
            std::fs::write(dir.join(IDENTITY_FILE_NAME), content).unwrap();
            let error = open(&dir, Storage::Disk).unwrap_err();
            assert!(matches!(error, IdentityError::Corrupt { .. }), "{content}: {error}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Node ids print as 32 hex digits and parse back; anything else is refused.
    #[test]
    fn node_ids_round_trip_through_text() {
        let id = NodeId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(id.to_string(), "0123456789abcdef0011223344556677");
        assert_eq!(NodeId::parse(&id.to_string()), Some(id));
        assert_eq!(NodeId::parse("0123"), None);
        assert_eq!(NodeId::parse("0123456789abcdef0011223344556g77"), None);
        assert_eq!(NodeId::parse("+123456789abcdef0011223344556677"), None);
    }

    /// Of two identities on one cluster address, the later start wins, then
    /// the higher incarnation; a renewed identity beats the one it renews.
    #[test]
    fn later_identity_wins_an_address_conflict() {
        let address: SocketAddr = "127.0.0.1:9404".parse().unwrap();
        let addresses = MemberId::seed(address).addresses;
        let make = |node: u128, incarnation, started_unix_ms| {
            MemberId::new(NodeIdentity { node_id: NodeId(node), incarnation, started_unix_ms }, addresses)
        };
        let old = make(1, 5, 1000);
        let restarted = make(1, 6, 2000);
        let wiped = make(2, 1, 3000);
        assert!(restarted.win_addr_conflict(&old) && !old.win_addr_conflict(&restarted));
        assert!(wiped.win_addr_conflict(&restarted), "a new id on the address replaces the old node");
        let renewed = old.renew().unwrap();
        assert_eq!(renewed.incarnation, 6);
        assert!(renewed.win_addr_conflict(&old));
        assert_eq!(renewed.addr(), old.addr());
    }

    /// Wildcard listeners are advertised on the advertised IP; specific
    /// ones keep theirs.
    #[test]
    fn wildcard_listeners_are_advertised_on_the_advertise_ip() {
        let config = crate::config::flags::parse::parse(&["--ingest-ilp", "off"]);
        let advertise: SocketAddr = "10.1.2.3:9404".parse().unwrap();
        let addresses = MemberAddresses::advertised(&config, advertise);
        assert_eq!(addresses.ingest, "10.1.2.3:9400".parse().unwrap());
        assert_eq!(addresses.ingest_ilp, None);
        assert_eq!(addresses.admin, "127.0.0.1:9402".parse().unwrap(), "admin stays on loopback");
        assert_eq!(addresses.cluster, advertise);
    }

    /// Without --advertise: a specific --cluster IP is used as is; a
    /// wildcard one takes the IP that routes to the first seed.
    #[test]
    fn default_advertise_follows_the_route_to_a_seed() {
        let specific: SocketAddr = "127.0.0.2:9404".parse().unwrap();
        assert_eq!(default_advertise(specific, &[]), (specific, true));
        let wildcard: SocketAddr = "0.0.0.0:9500".parse().unwrap();
        let seed: SocketAddr = "127.0.0.1:9404".parse().unwrap();
        assert_eq!(default_advertise(wildcard, &[seed]), ("127.0.0.1:9500".parse().unwrap(), true));
        assert_eq!(default_advertise(wildcard, &[]), ("127.0.0.1:9500".parse().unwrap(), false));
    }
}
