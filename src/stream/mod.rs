//! Named streams and the catalog that lists them.
//!
//! A stream has a name (`[a-z0-9._-]{1,64}`), a partition count and a
//! retention (bytes per partition, age). `default` exists from the start
//! with `--partitions` partitions, so a producer that never names a stream
//! writes there.
//!
//! Inside the engine a stream's partitions are a contiguous range of
//! *global partition ids*, `base .. base + partitions`, in one space of
//! `--partitions-max` ids shared by every stream. Routing, placement,
//! credits, load reports and migration all work on global ids unchanged,
//! so the balancer sees every stream's partitions at once; only the faces
//! translate (`SUB clicks 3` reads global id `base(clicks) + 3`, and a
//! subscriber line says `3`). A deleted stream's range is free again once
//! nothing routed to it can still be in flight (every shard's fence, see
//! [`crate::shard::streams`]: normally milliseconds after the delete, and at
//! the latest at the next start), so a batch of a deleted stream never
//! lands in a new one. Ids and ranges are kept in the catalog file, so a
//! partition's files stay with its stream across restarts.
//!
//! The catalog is persisted in `<data-dir>/streams.json`, replaced
//! atomically and durably ([`crate::storage::durable::replace_durably`]);
//! with `--storage memory` it lives in memory only.
//!
//! # Deleting is atomic across a crash
//!
//! A delete first moves the stream from `streams` to `deleting` in the
//! catalog file (a tombstone, with its aggregates gone): from the moment
//! that file is durable the stream is deleted, and before it nothing of it
//! was touched. Only then are its partitions closed and its directories
//! (`streams/<name>`, `groups/<name>`) renamed into `<data-dir>/trash/`
//! (the renames fsynced), then the tombstone removed, then the trash
//! deleted. A start finds any tombstone left by a crash and finishes its
//! delete before anything else ([`Catalog::open`]), so after a restart a
//! stream is whole or gone, never partly there. A start also moves to the
//! trash any stream or group directory that no stream of the catalog owns
//! (an older release's half-finished delete), so a new stream never opens
//! a deleted one's files.

pub mod trash;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Config, Storage};
pub use crate::protocol::Partitioner;
use crate::runtime::log;

/// The stream producers write to when they name none.
pub const DEFAULT_STREAM: &str = "default";
/// The longest stream name (one path component in the data directory).
pub use crate::storage::dir::STREAM_NAME_SIZE_MAX;
/// Most streams at once (the catalog is a few hundred bytes per stream on
/// every shard).
pub const STREAMS_MAX: usize = 1024;
/// Name of the catalog file in the data directory.
pub const CATALOG_FILE_NAME: &str = "streams.json";
/// Where deleted streams' directories wait to be removed.
pub const TRASH_DIR_NAME: &str = "trash";
pub use crate::config::limits::RETENTION_MS_MAX;

/// One stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSpec {
    /// Never reused: part of every frame's log id on disk.
    pub id: u32,
    pub name: String,
    pub partitions: u32,
    /// The stream's first global partition id.
    pub base: u32,
    /// Bytes of log kept per partition.
    pub retention_bytes: u64,
    /// Age after which segments are deleted; 0 keeps them.
    pub retention_ms: u64,
    /// How keys of lines, JSON and ILP map to partitions (Kafka clients
    /// choose their own). Catalogs written before the setting existed have
    /// none: `xxh3`, what they were routed by.
    #[serde(default)]
    pub partitioner: Partitioner,
    /// Copies of each partition on different nodes, each partition a Raft
    /// group ([`crate::replication`]); 1 (the default, and what catalogs
    /// written before the setting mean) is today's unreplicated stream, and
    /// is not written to the catalog, so such a catalog stays byte for byte
    /// what it was.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub replication_factor: u32,
}

fn one() -> u32 {
    1
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

impl StreamSpec {
    /// Whether its partitions are Raft groups (replication factor above 1).
    pub fn is_replicated(&self) -> bool {
        self.replication_factor > 1
    }

    /// The Raft group id's stream part: a hash of the name, so every node
    /// names the group alike although each allocates its own stream ids
    /// and partition ranges (the cluster's catalog replicates the streams'
    /// settings, not those local numbers).
    pub fn group_stream_id(&self) -> u32 {
        group_stream_id(&self.name)
    }

    pub fn route(&self) -> StreamRoute {
        StreamRoute { id: self.id, base: self.base, partitions: self.partitions, partitioner: self.partitioner }
    }

    /// The stream partition (`0..partitions`) of `key`, by the stream's partitioner.
    #[inline]
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        self.partitioner.partition_of(key, self.partitions)
    }

    /// The global id of the stream's partition `local`.
    pub fn global(&self, local: u32) -> u32 {
        assert!(local < self.partitions, "partition {local} of {} in {}", self.partitions, self.name);
        self.base + local
    }

    /// The global ids of the stream's partitions, in order.
    pub fn globals(&self) -> std::ops::Range<u32> {
        self.base..self.base + self.partitions
    }

    /// Whether global id `global` is one of this stream's partitions.
    pub fn contains(&self, global: u32) -> bool {
        global >= self.base && global - self.base < self.partitions
    }

    /// The id of partition `local`'s log on disk (in every frame).
    pub fn log_id(&self, local: u32) -> u64 {
        (u64::from(self.id) << 32) | u64::from(local)
    }
}

/// What a connection routes by: a stream's id and its partition range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRoute {
    pub id: u32,
    pub base: u32,
    pub partitions: u32,
    pub partitioner: Partitioner,
}

/// A request to create a stream (the body of `POST /streams`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewStream {
    pub name: String,
    pub partitions: u32,
    #[serde(default)]
    pub retention_bytes: Option<u64>,
    #[serde(default)]
    pub retention_ms: Option<u64>,
    /// `"xxh3"` (the default) or `"murmur2"` (as the Java Kafka client).
    #[serde(default)]
    pub partitioner: Option<Partitioner>,
    /// Copies of each partition on different nodes (default 1: none).
    #[serde(default)]
    pub replication_factor: Option<u32>,
}

/// The Raft group id's stream part for stream `name` (see
/// [`StreamSpec::group_stream_id`]).
pub fn group_stream_id(name: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes()) as u32
}

/// Why the catalog refused a change, with what the user needs to fix it.
#[derive(Debug)]
pub enum CatalogError {
    BadName {
        name: String,
    },
    Exists {
        name: String,
    },
    Unknown {
        name: String,
    },
    /// `default` cannot be deleted (producers that name no stream use it).
    DeleteDefault,
    PartitionCount {
        partitions: u32,
        partitions_max: u32,
    },
    /// No free range of that many global ids is left.
    NoRoom {
        partitions: u32,
        free: u32,
        partitions_max: u32,
    },
    TooManyStreams {
        streams_max: usize,
    },
    /// The retention is below one segment (or zero bytes).
    Retention {
        retention_bytes: u64,
        segment_bytes: u64,
    },
    /// The byte retention is above what this storage allows per partition
    /// (with memory storage, `--retention-bytes`: the memory formula's term).
    RetentionBytesTooLarge {
        retention_bytes: u64,
        retention_bytes_max: u64,
    },
    /// The age retention is above [`RETENTION_MS_MAX`].
    RetentionMsTooLarge {
        retention_ms: u64,
    },
    /// The replication factor is 0, above what this node allows (1 without
    /// a cluster), or the stream's name hashes like a replicated one's.
    ReplicationFactor {
        replication_factor: u32,
        replication_factor_max: u32,
    },
    GroupIdTaken {
        name: String,
        other: String,
    },
    /// The catalog on disk says `default` has another partition count.
    DefaultMismatch {
        on_disk: u32,
        flag: u32,
    },
    /// The catalog on disk does not fit this configuration.
    Invalid {
        why: String,
    },
    Io {
        op: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}

impl std::fmt::Display for CatalogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatalogError::BadName { name } => {
                write!(f, "bad_name: stream name {name:?} is not 1 to {STREAM_NAME_SIZE_MAX} of [a-z0-9._-]")
            }
            CatalogError::Exists { name } => write!(f, "exists: stream {name:?} already exists"),
            CatalogError::Unknown { name } => write!(f, "unknown_stream: {name}"),
            CatalogError::DeleteDefault => write!(f, "refused: the default stream cannot be deleted"),
            CatalogError::PartitionCount { partitions, partitions_max } => {
                write!(f, "bad_partitions: {partitions} partitions; a stream has 1 to {partitions_max}")
            }
            CatalogError::NoRoom { partitions, free, partitions_max } => {
                write!(f, "no_room: {partitions} partitions asked, {free} free of --partitions-max {partitions_max}")
            }
            CatalogError::TooManyStreams { streams_max } => write!(f, "too_many_streams: at most {streams_max}"),
            CatalogError::Retention { retention_bytes, segment_bytes } => write!(
                f,
                "bad_retention: retention_bytes {retention_bytes} must be at least one segment ({segment_bytes})"
            ),
            CatalogError::RetentionBytesTooLarge { retention_bytes, retention_bytes_max } => write!(
                f,
                "bad_retention: retention_bytes {retention_bytes} is over {retention_bytes_max}, the \
                 --retention-bytes a memory-storage server is started with (what its memory bound counts \
                 per partition)"
            ),
            CatalogError::RetentionMsTooLarge { retention_ms } => write!(
                f,
                "bad_retention: retention_ms {retention_ms} is over the maximum {RETENTION_MS_MAX} (100 years; \
                 0 keeps segments regardless of age)"
            ),
            CatalogError::ReplicationFactor { replication_factor, replication_factor_max: 1 } => write!(
                f,
                "bad_replication_factor: {replication_factor}; this node is not in a cluster (start it with \
                 --cluster or --join), so 1 is the only replication factor"
            ),
            CatalogError::ReplicationFactor { replication_factor, replication_factor_max } => write!(
                f,
                "bad_replication_factor: {replication_factor}; a stream has 1 to {replication_factor_max} copies"
            ),
            CatalogError::GroupIdTaken { name, other } => write!(
                f,
                "group_id_taken: stream {name:?} hashes to the same replication group id as the replicated \
                 stream {other:?}; choose another name"
            ),
            CatalogError::DefaultMismatch { on_disk, flag } => write!(
                f,
                "the data directory's default stream has {on_disk} partitions, --partitions says {flag}; \
                 a stream's partition count is fixed for the life of its data (pass --partitions {on_disk})"
            ),
            CatalogError::Invalid { why } => write!(f, "the stream catalog does not fit this configuration: {why}"),
            CatalogError::Io { op, path, error } => write!(f, "{op} {}: {error}", path.display()),
        }
    }
}

impl std::error::Error for CatalogError {}

impl CatalogError {
    /// Whether the catalog could not be written because the disk (or
    /// quota) is full.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, CatalogError::Io { error, .. } if matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
    }

    /// The HTTP status an admin request gets for this error.
    pub fn http_status(&self) -> u16 {
        match self {
            CatalogError::Unknown { .. } => 404,
            CatalogError::Exists { .. } => 409,
            CatalogError::Io { .. } | CatalogError::Invalid { .. } => 500,
            CatalogError::NoRoom { .. } | CatalogError::TooManyStreams { .. } => 507,
            _ => 400,
        }
    }
}

/// Checks a stream name: 1 to 64 of `[a-z0-9._-]`, not `.` or `..`.
pub fn check_name(name: &str) -> Result<(), CatalogError> {
    let charset = name.bytes().all(|byte| matches!(byte, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'));
    let size = (1..=STREAM_NAME_SIZE_MAX).contains(&name.len());
    if !charset || !size || name == "." || name == ".." {
        return Err(CatalogError::BadName { name: name.chars().take(100).collect() });
    }
    Ok(())
}

/// Every stream, by id, and the global id ranges no longer used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    next_id: u32,
    streams: Vec<StreamSpec>,
    /// Ranges of deleted streams (base, partitions): not reused until
    /// nothing can be in flight for them ([`Catalog::release`]) or a restart.
    #[serde(skip)]
    retired: Vec<(u32, u32)>,
    /// Streams whose delete began (durably) and has not finished: gone for
    /// every user, their ranges still taken; see the module doc.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    deleting: Vec<StreamSpec>,
    /// Keyed aggregates declared on the streams ([`crate::aggregate`]), in
    /// the order they were declared; names are unique across streams.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    aggregates: Vec<crate::aggregate::AggregateDeclaration>,
    /// Aggregates kept in the catalog but not run, each with the cycle it
    /// closes: a catalog from before cycles were refused
    /// ([`Catalog::suspend_cycles`]). Found again at every start.
    #[serde(skip)]
    suspended: Vec<(String, crate::aggregate::Cycle)>,
    /// In a cluster: the index of the last entry of the cluster's catalog
    /// log ([`crate::admin::replicated`]) this catalog has applied, saved
    /// with the change it made, so a restart applies the entries after it
    /// and none twice. 0 (never written) on a node that applied none.
    #[serde(default, skip_serializing_if = "is_zero")]
    replicated_index: u64,
    /// In a cluster: the request ids of the latest catalog-log commands
    /// applied, oldest first, at most [`REPLICATED_REQUESTS_MAX`]: a command
    /// proposed again (its first answer was lost) is applied once, on every
    /// node alike, restarts included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    replicated_requests: Vec<u64>,
}

/// Request ids of applied catalog-log commands a catalog keeps (8 bytes
/// each): a retry comes within seconds of its first proposal.
pub const REPLICATED_REQUESTS_MAX: usize = 256;

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Catalog {
    /// The last entry of the cluster's catalog log applied here (0: none).
    pub fn replicated_index(&self) -> u64 {
        self.replicated_index
    }

    /// Marks the cluster's catalog log applied up to `index` (saved with
    /// the catalog's next save).
    pub fn set_replicated_index(&mut self, index: u64) {
        self.replicated_index = index;
    }

    /// Notes catalog-log command `request_id` as applied; false if it was
    /// already (a retry: not applied again).
    pub fn note_replicated_request(&mut self, request_id: u64) -> bool {
        if self.replicated_requests.contains(&request_id) {
            return false;
        }
        if self.replicated_requests.len() >= REPLICATED_REQUESTS_MAX {
            self.replicated_requests.remove(0);
        }
        self.replicated_requests.push(request_id);
        true
    }

    /// Takes back [`Self::note_replicated_request`] (the change was not saved).
    pub fn forget_replicated_request(&mut self, request_id: u64) {
        self.replicated_requests.retain(|id| *id != request_id);
    }

    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }

    pub fn get(&self, name: &str) -> Option<&StreamSpec> {
        self.streams.iter().find(|spec| spec.name == name)
    }

    /// The top-level JSON member the first of stream `id`'s aggregates that
    /// reads one reads (`json:/name`): the JSON listener notes where its
    /// value starts in each event it validates, so the owner does not
    /// scan for it ([`crate::protocol::record::RecordRef::value_at`]).
    pub fn json_value_member(&self, id: u32) -> Option<&[u8]> {
        let name = &self.by_id(id)?.name;
        self.aggregates_of(name).find_map(|declaration| match &declaration.value {
            crate::aggregate::ValueSource::Json(spec) => spec.top_level_member(),
            _ => None,
        })
    }

    pub fn by_id(&self, id: u32) -> Option<&StreamSpec> {
        self.streams.iter().find(|spec| spec.id == id)
    }

    /// The stream holding global partition `global`, and its local number.
    pub fn stream_of(&self, global: u32) -> Option<(&StreamSpec, u32)> {
        self.streams.iter().find(|spec| spec.contains(global)).map(|spec| (spec, global - spec.base))
    }

    /// Adds a stream with `request`'s settings (retention defaults from
    /// `defaults`), in the first free range of global ids.
    pub fn create(&mut self, request: &NewStream, limits: &CatalogLimits) -> Result<StreamSpec, CatalogError> {
        check_name(&request.name)?;
        if self.get(&request.name).is_some() || self.deleting.iter().any(|spec| spec.name == request.name) {
            return Err(CatalogError::Exists { name: request.name.clone() });
        }
        if self.streams.len() >= STREAMS_MAX {
            return Err(CatalogError::TooManyStreams { streams_max: STREAMS_MAX });
        }
        let partitions_max = limits.partitions_max;
        if request.partitions == 0 || request.partitions > partitions_max {
            return Err(CatalogError::PartitionCount { partitions: request.partitions, partitions_max });
        }
        let retention_bytes = request.retention_bytes.unwrap_or(limits.retention_bytes);
        if retention_bytes < limits.segment_bytes {
            return Err(CatalogError::Retention { retention_bytes, segment_bytes: limits.segment_bytes });
        }
        if retention_bytes > limits.retention_bytes_max {
            let retention_bytes_max = limits.retention_bytes_max;
            return Err(CatalogError::RetentionBytesTooLarge { retention_bytes, retention_bytes_max });
        }
        let retention_ms = request.retention_ms.unwrap_or(limits.retention_ms);
        if retention_ms > RETENTION_MS_MAX {
            return Err(CatalogError::RetentionMsTooLarge { retention_ms });
        }
        let replication_factor = self.check_replication(request, limits)?;
        let base = self.free_range(request.partitions, partitions_max)?;
        let spec = StreamSpec {
            id: self.next_id,
            name: request.name.clone(),
            partitions: request.partitions,
            base,
            retention_bytes,
            retention_ms,
            partitioner: request.partitioner.unwrap_or_default(),
            replication_factor,
        };
        self.next_id += 1;
        self.streams.push(spec.clone());
        Ok(spec)
    }

    /// The replication factor `request` asks for, checked against the
    /// limit and against the group ids of the replicated streams.
    fn check_replication(&self, request: &NewStream, limits: &CatalogLimits) -> Result<u32, CatalogError> {
        let replication_factor = request.replication_factor.unwrap_or(1);
        if replication_factor == 0 || replication_factor > limits.replication_factor_max {
            let replication_factor_max = limits.replication_factor_max;
            return Err(CatalogError::ReplicationFactor { replication_factor, replication_factor_max });
        }
        let group = group_stream_id(&request.name);
        if replication_factor > 1 && group == crate::replication::CATALOG_GROUP.stream_id {
            let other = "(the cluster's catalog group)".to_string();
            return Err(CatalogError::GroupIdTaken { name: request.name.clone(), other });
        }
        if replication_factor > 1
            && let Some(other) =
                self.streams.iter().find(|spec| spec.is_replicated() && spec.group_stream_id() == group)
        {
            return Err(CatalogError::GroupIdTaken { name: request.name.clone(), other: other.name.clone() });
        }
        Ok(replication_factor)
    }

    /// Every aggregate, in declaration order.
    pub fn aggregates(&self) -> &[crate::aggregate::AggregateDeclaration] {
        &self.aggregates
    }

    /// The aggregates declared on `stream`.
    pub fn aggregates_of<'c>(
        &'c self,
        stream: &'c str,
    ) -> impl Iterator<Item = &'c crate::aggregate::AggregateDeclaration> + 'c {
        self.aggregates.iter().filter(move |declaration| declaration.stream == stream)
    }

    /// Adds an aggregate (the caller checked the name and the streams).
    pub fn add_aggregate(&mut self, declaration: crate::aggregate::AggregateDeclaration) {
        self.aggregates.push(declaration);
    }

    /// Removes an aggregate by name.
    pub fn remove_aggregate(&mut self, name: &str) -> Option<crate::aggregate::AggregateDeclaration> {
        let index = self.aggregates.iter().position(|declaration| declaration.name == name)?;
        self.suspended.retain(|(suspended, _)| suspended != name);
        Some(self.aggregates.remove(index))
    }

    /// Suspends each aggregate that closes a cycle with the ones declared
    /// before it (a catalog written before cycles were refused; see
    /// [`crate::aggregate::cycles_in`]) and returns them with their cycles.
    /// A suspended aggregate stays declared (listed, deletable, saved) but
    /// is not run: [`Catalog::running`] leaves it out of the shards' copy.
    pub fn suspend_cycles(&mut self) -> Vec<(crate::aggregate::AggregateDeclaration, crate::aggregate::Cycle)> {
        let cycles = crate::aggregate::cycles_in(&self.aggregates);
        let suspended: Vec<_> =
            cycles.into_iter().map(|(index, cycle)| (self.aggregates[index].clone(), cycle)).collect();
        self.suspended =
            suspended.iter().map(|(declaration, cycle)| (declaration.name.clone(), cycle.clone())).collect();
        suspended
    }

    /// The cycle a suspended aggregate closes, or `None` if it runs.
    pub fn suspended(&self, name: &str) -> Option<&crate::aggregate::Cycle> {
        self.suspended.iter().find(|(suspended, _)| suspended == name).map(|(_, cycle)| cycle)
    }

    /// Resumes, in declaration order, each suspended aggregate that closes
    /// no cycle with the running ones any more (an aggregate of its cycle
    /// was deleted) and returns them, for the shards to start. The running
    /// aggregates stay acyclic: each one resumed joins them before the next
    /// is checked.
    pub fn resume_acyclic(&mut self) -> Vec<crate::aggregate::AggregateDeclaration> {
        let mut running: Vec<_> =
            self.aggregates.iter().filter(|declaration| self.suspended(&declaration.name).is_none()).cloned().collect();
        let mut resumed = Vec::new();
        for declaration in self.aggregates.iter().filter(|declaration| self.suspended(&declaration.name).is_some()) {
            if crate::aggregate::cycle_closed_by(&running, declaration).is_none() {
                running.push(declaration.clone());
                resumed.push(declaration.clone());
            }
        }
        self.suspended.retain(|(name, _)| !resumed.iter().any(|declaration| declaration.name == *name));
        resumed
    }

    /// The catalog the shards run: every stream, and every aggregate but the
    /// suspended ones.
    pub fn running(&self) -> Catalog {
        let mut running = self.clone();
        running.aggregates.retain(|declaration| self.suspended(&declaration.name).is_none());
        running.suspended.clear();
        running
    }

    /// Begins deleting a stream: it leaves `streams` for `deleting`, with
    /// its aggregates (their state lives in its partitions). Save the
    /// catalog next: that is the moment the stream is deleted.
    pub fn begin_delete(&mut self, name: &str) -> Result<StreamSpec, CatalogError> {
        if name == DEFAULT_STREAM {
            return Err(CatalogError::DeleteDefault);
        }
        let index = self.streams.iter().position(|spec| spec.name == name);
        let index = index.ok_or_else(|| CatalogError::Unknown { name: name.to_string() })?;
        let spec = self.streams.remove(index);
        self.aggregates.retain(|declaration| declaration.stream != name);
        self.deleting.push(spec.clone());
        let aggregates = &self.aggregates;
        self.suspended.retain(|(suspended, _)| aggregates.iter().any(|declaration| declaration.name == *suspended));
        Ok(spec)
    }

    /// Takes back a delete whose tombstone could not be saved (its
    /// aggregates, removed with it, are given back by the caller).
    pub fn undo_begin_delete(&mut self, spec: &StreamSpec) {
        self.deleting.retain(|deleting| deleting.id != spec.id);
        self.streams.push(spec.clone());
        self.streams.sort_by_key(|spec| spec.id);
    }

    /// Ends a delete (its files are gone): the tombstone goes, and its range
    /// stays taken until [`Catalog::release`].
    pub fn finish_delete(&mut self, id: u32) {
        if let Some(index) = self.deleting.iter().position(|spec| spec.id == id) {
            let spec = self.deleting.remove(index);
            self.retired.push((spec.base, spec.partitions));
        }
    }

    /// Takes back a create that could not be carried out (nothing of it was
    /// stored or routed to): its range is free at once.
    pub fn undo_create(&mut self, id: u32) {
        self.streams.retain(|spec| spec.id != id);
    }

    /// Streams whose delete has begun and not finished.
    pub fn deleting(&self) -> &[StreamSpec] {
        &self.deleting
    }

    /// A deleted stream's range is free again: nothing routed to it can
    /// still be in flight.
    pub fn release(&mut self, base: u32, partitions: u32) {
        self.retired.retain(|&range| range != (base, partitions));
    }

    /// The lowest base where `count` ids are free of live and retired ranges.
    fn free_range(&self, count: u32, partitions_max: u32) -> Result<u32, CatalogError> {
        let mut used: Vec<(u32, u32)> =
            self.streams.iter().chain(&self.deleting).map(|spec| (spec.base, spec.partitions)).collect();
        used.extend_from_slice(&self.retired);
        used.sort_unstable();
        let mut candidate = 0u32;
        for (base, partitions) in used {
            if base >= candidate && base - candidate >= count {
                break;
            }
            candidate = candidate.max(base + partitions);
        }
        if partitions_max.saturating_sub(candidate) >= count {
            return Ok(candidate);
        }
        let taken: u32 = self.streams.iter().chain(&self.deleting).map(|spec| spec.partitions).sum::<u32>()
            + self.retired.iter().map(|(_, partitions)| partitions).sum::<u32>();
        Err(CatalogError::NoRoom { partitions: count, free: partitions_max.saturating_sub(taken), partitions_max })
    }

    /// The catalog in `data_dir`, or a new one with `default`; checks that it
    /// fits the configuration. Writes it back when it was created. Finishes
    /// the deletes a crash interrupted and moves directories no stream owns
    /// to the trash (see the module doc), saying so on stderr.
    pub fn open(data_dir: &Path, limits: &CatalogLimits, default_partitions: u32) -> Result<Catalog, CatalogError> {
        match Catalog::open_deferring(data_dir, limits, default_partitions)? {
            (catalog, None) => Ok(catalog),
            (_, Some(error)) => Err(error),
        }
    }

    /// Like [`Catalog::open`], except that a new catalog that cannot be
    /// written for lack of disk space comes back with that error instead of
    /// failing: the server starts with it and saves it once it can
    /// ([`UnsavedCatalog`]).
    pub fn open_deferring(
        data_dir: &Path,
        limits: &CatalogLimits,
        default_partitions: u32,
    ) -> Result<(Catalog, Option<CatalogError>), CatalogError> {
        let (mut catalog, unsaved) = Catalog::read(data_dir, limits, default_partitions)?;
        if !catalog.deleting.is_empty() {
            for spec in &catalog.deleting {
                trash::move_stream_to_trash(data_dir, spec)?;
                log::info!(stream = &spec.name, "finished its delete (id {}), which a crash interrupted", spec.id);
            }
            catalog.deleting.clear();
            // Without the save (a full disk) the next start does it again.
            if let Err(error) = catalog.save(data_dir) {
                log::warn!("could not save the catalog after finishing deletes: {error}");
            }
        }
        let live: Vec<&str> = catalog.streams.iter().map(|spec| spec.name.as_str()).collect();
        for orphan in trash::move_orphans_to_trash(data_dir, &live)? {
            log::info!("{} belongs to no stream of the catalog: moved to the trash", orphan.display());
        }
        Ok((catalog, unsaved))
    }

    /// The catalog file as it is, or a new catalog (saved if it can be: see
    /// [`Catalog::open_deferring`]) if there is none.
    fn read(
        data_dir: &Path,
        limits: &CatalogLimits,
        default_partitions: u32,
    ) -> Result<(Catalog, Option<CatalogError>), CatalogError> {
        let path = data_dir.join(CATALOG_FILE_NAME);
        let catalog = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Catalog>(&bytes)
                .map_err(|error| CatalogError::Invalid { why: format!("{}: {error}", path.display()) })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let catalog = Catalog::with_default(limits, default_partitions)?;
                return match catalog.save(data_dir) {
                    Ok(()) => Ok((catalog, None)),
                    Err(error) if error.is_storage_full() => Ok((catalog, Some(error))),
                    Err(error) => Err(error),
                };
            }
            Err(error) => return Err(CatalogError::Io { op: "read", path, error }),
        };
        catalog.check(limits, default_partitions)?;
        Ok((catalog, None))
    }

    /// A catalog holding only `default` (memory storage, or a new data dir).
    pub fn with_default(limits: &CatalogLimits, default_partitions: u32) -> Result<Catalog, CatalogError> {
        let mut catalog = Catalog::default();
        let request = NewStream {
            name: DEFAULT_STREAM.to_string(),
            partitions: default_partitions,
            retention_bytes: None,
            retention_ms: None,
            partitioner: None,
            replication_factor: None,
        };
        catalog.create(&request, limits)?;
        Ok(catalog)
    }

    fn check(&self, limits: &CatalogLimits, default_partitions: u32) -> Result<(), CatalogError> {
        let default =
            self.get(DEFAULT_STREAM).ok_or_else(|| CatalogError::Invalid { why: "no default stream".into() })?;
        if default.partitions != default_partitions {
            return Err(CatalogError::DefaultMismatch { on_disk: default.partitions, flag: default_partitions });
        }
        for spec in self.streams.iter().chain(&self.deleting) {
            check_name(&spec.name)?;
            if spec.base.checked_add(spec.partitions).is_none_or(|end| end > limits.partitions_max) {
                let why = format!("stream {} needs --partitions-max {}", spec.name, spec.base + spec.partitions);
                return Err(CatalogError::Invalid { why });
            }
            if spec.id >= self.next_id {
                return Err(CatalogError::Invalid { why: format!("stream {} has id {} >= next", spec.name, spec.id) });
            }
        }
        Ok(())
    }

    /// Writes the catalog atomically and durably
    /// ([`crate::storage::durable::replace_durably`]). On failure (a full
    /// disk) the old file stays and no temporary file is left.
    pub fn save(&self, data_dir: &Path) -> Result<(), CatalogError> {
        let bytes = serde_json::to_vec_pretty(self).expect("a catalog serializes");
        crate::storage::durable::replace_durably(&data_dir.join(CATALOG_FILE_NAME), &bytes)
            .map_err(|error| CatalogError::Io { op: error.op, path: error.path, error: error.source })
    }
}

/// Why the catalog created at start-up is not on disk yet (the disk was
/// full), shared by the server and its admin thread, which saves it once it
/// can and then clears this.
#[derive(Debug, Clone, Default)]
pub struct UnsavedCatalog(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl UnsavedCatalog {
    /// Why it is unsaved, while it is.
    pub fn reason(&self) -> Option<String> {
        self.0.lock().map(|reason| reason.clone()).unwrap_or(None)
    }

    pub fn set(&self, reason: String) {
        if let Ok(mut held) = self.0.lock() {
            *held = Some(reason);
        }
    }

    pub fn clear(&self) {
        if let Ok(mut held) = self.0.lock() {
            *held = None;
        }
    }
}

/// The limits and defaults a catalog applies (from the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogLimits {
    pub partitions_max: u32,
    pub retention_bytes: u64,
    /// The largest `retention_bytes` a stream may ask for: `--retention-bytes`
    /// with memory storage (the memory formula counts it per partition),
    /// unbounded on disk (files are not in the formula).
    pub retention_bytes_max: u64,
    pub retention_ms: u64,
    pub segment_bytes: u64,
    /// The largest replication factor a stream may ask for: 1 on a node
    /// without a cluster, [`crate::replication::placement::REPLICATION_FACTOR_MAX`] in one.
    pub replication_factor_max: u32,
}

/// What the catalog takes from the flags (here rather than in `config`,
/// which knows no stream types).
impl Config {
    /// What the stream catalog applies: the capacity and the defaults.
    pub fn catalog_limits(&self) -> CatalogLimits {
        let retention_bytes_max = match self.storage {
            Storage::Memory => self.retention_bytes() as u64,
            Storage::Disk => u64::MAX,
        };
        CatalogLimits {
            partitions_max: self.partitions_max,
            retention_bytes: self.retention_bytes() as u64,
            retention_bytes_max,
            retention_ms: self.retention_ms,
            segment_bytes: self.segment_bytes() as u64,
            replication_factor_max: if self.cluster_address().is_some() {
                crate::replication::placement::REPLICATION_FACTOR_MAX as u32
            } else {
                1
            },
        }
    }
}

/// One shard's copy of the catalog. A stream is *installed* once the
/// shard opened the partitions it owns, and *active* once every shard has
/// installed it: only then does ingest route to it (a batch must never reach
/// an owner that has not installed its partition). Deleting deactivates
/// first, everywhere, then removes.
#[derive(Debug, Clone, Default)]
pub struct ShardStreams {
    catalog: Catalog,
    inactive: Vec<u32>,
}

impl ShardStreams {
    /// A shard starting with `catalog`, every stream active.
    pub fn new(catalog: Catalog) -> ShardStreams {
        ShardStreams { catalog, inactive: Vec::new() }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// For aggregate declarations, which change this shard's copy.
    pub fn catalog_mut(&mut self) -> &mut Catalog {
        &mut self.catalog
    }

    /// The route of an active stream by name.
    pub fn route_for(&self, name: &[u8]) -> Option<StreamRoute> {
        let name = std::str::from_utf8(name).ok()?;
        self.catalog.get(name).filter(|spec| !self.inactive.contains(&spec.id)).map(StreamSpec::route)
    }

    /// Whether ingest may still route to stream `id`.
    pub fn is_active(&self, id: u32) -> bool {
        self.catalog.by_id(id).is_some() && !self.inactive.contains(&id)
    }

    /// Installs a new stream, not yet active.
    pub fn install(&mut self, spec: StreamSpec) {
        assert!(self.catalog.by_id(spec.id).is_none(), "stream {} installed twice", spec.name);
        self.inactive.push(spec.id);
        self.catalog.streams.push(spec);
    }

    pub fn activate(&mut self, id: u32) {
        self.inactive.retain(|&inactive| inactive != id);
    }

    pub fn deactivate(&mut self, id: u32) {
        if !self.inactive.contains(&id) {
            self.inactive.push(id);
        }
    }

    /// Forgets a stream (its range is never reused while the server runs).
    pub fn remove(&mut self, id: u32) -> Option<StreamSpec> {
        let index = self.catalog.streams.iter().position(|spec| spec.id == id)?;
        self.inactive.retain(|&inactive| inactive != id);
        let spec = self.catalog.streams.remove(index);
        self.catalog.retired.push((spec.base, spec.partitions));
        self.catalog.aggregates.retain(|declaration| declaration.stream != spec.name);
        Some(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> CatalogLimits {
        CatalogLimits {
            partitions_max: 64,
            retention_bytes: 1 << 20,
            retention_bytes_max: 1 << 24,
            retention_ms: 1000,
            segment_bytes: 1 << 16,
            replication_factor_max: 1,
        }
    }

    fn request(name: &str, partitions: u32) -> NewStream {
        NewStream {
            name: name.into(),
            partitions,
            retention_bytes: None,
            retention_ms: None,
            partitioner: None,
            replication_factor: None,
        }
    }

    /// A stream keeps the partitioner it was created with across a save and
    /// a load; a catalog saved before the setting existed (no field) reads
    /// as xxh3, what its streams were routed by; an unknown name is refused.
    #[test]
    fn partitioner_is_kept_and_defaults_to_xxh3() {
        let mut catalog = Catalog::default();
        let murmur2 = NewStream { partitioner: Some(Partitioner::Murmur2), ..request("javalike", 4) };
        let spec = catalog.create(&murmur2, &limits()).unwrap();
        assert_eq!(spec.partitioner, Partitioner::Murmur2);
        assert_eq!(spec.route().partitioner, Partitioner::Murmur2);
        assert_eq!(spec.partition_of(b"foobar"), crate::protocol::murmur2_partition_of(b"foobar", 4));
        assert_eq!(catalog.create(&request("plain", 4), &limits()).unwrap().partitioner, Partitioner::Xxh3);
        let json = serde_json::to_string(&catalog).unwrap();
        assert!(json.contains("\"partitioner\":\"murmur2\""), "{json}");
        let loaded: Catalog = serde_json::from_str(&json).unwrap();
        assert_eq!(loaded.get("javalike").unwrap().partitioner, Partitioner::Murmur2);
        let old = r#"{"id":3,"name":"old","partitions":2,"base":0,"retention_bytes":1,"retention_ms":0}"#;
        let old: StreamSpec = serde_json::from_str(old).unwrap();
        assert_eq!(old.partitioner, Partitioner::Xxh3);
        let bad = r#"{"name":"x","partitions":1,"partitioner":"fnv"}"#;
        assert!(serde_json::from_str::<NewStream>(bad).is_err());
    }

    /// Streams get disjoint ranges, first fit; a deleted stream's range is
    /// not reused while its delete runs nor until it is released; names and
    /// counts are checked with the numbers.
    #[test]
    fn ranges_are_disjoint_and_reused_only_once_released() {
        let mut catalog = Catalog::with_default(&limits(), 8).unwrap();
        let clicks = catalog.create(&request("clicks", 16), &limits()).unwrap();
        assert_eq!((clicks.base, clicks.id), (8, 1));
        let pay = catalog.create(&request("pay.v2", 8), &limits()).unwrap();
        assert_eq!(pay.base, 24);
        catalog.begin_delete("clicks").unwrap();
        assert!(catalog.get("clicks").is_none(), "a stream being deleted is gone for users");
        assert!(matches!(catalog.create(&request("clicks", 1), &limits()), Err(CatalogError::Exists { .. })));
        let next = catalog.create(&request("next", 16), &limits()).unwrap();
        assert_eq!(next.base, 32, "the deleted range stays unused while its delete runs");
        catalog.finish_delete(clicks.id);
        assert!(catalog.deleting().is_empty());
        assert_eq!(catalog.stream_of(35), Some((&next, 3)));
        assert!(matches!(catalog.create(&request("big", 17), &limits()), Err(CatalogError::NoRoom { free: 16, .. })));
        catalog.release(clicks.base, clicks.partitions);
        let reused = catalog.create(&request("reused", 16), &limits()).unwrap();
        assert_eq!(reused.base, 8, "a released range is free again");
        assert_ne!(reused.id, clicks.id, "ids are never reused");
        assert!(matches!(catalog.create(&request("Bad", 1), &limits()), Err(CatalogError::BadName { .. })));
        assert!(matches!(catalog.create(&request("pay.v2", 1), &limits()), Err(CatalogError::Exists { .. })));
        assert!(matches!(catalog.create(&request("z", 0), &limits()), Err(CatalogError::PartitionCount { .. })));
        assert!(matches!(catalog.begin_delete("default"), Err(CatalogError::DeleteDefault)));
        assert!(matches!(catalog.begin_delete("nope"), Err(CatalogError::Unknown { .. })));
        let small = NewStream { retention_bytes: Some(10), ..request("small", 1) };
        assert!(matches!(catalog.create(&small, &limits()), Err(CatalogError::Retention { .. })));
    }

    /// Retention past its maximum is refused with the numbers (u64::MAX and
    /// 2^63 too, which the age check once wrapped); the maxima are accepted.
    #[test]
    fn retention_limits_are_checked_with_their_numbers() {
        let mut catalog = Catalog::with_default(&limits(), 4).unwrap();
        for retention_ms in [u64::MAX, 1 << 63, RETENTION_MS_MAX + 1] {
            let aged = NewStream { retention_ms: Some(retention_ms), ..request("aged", 1) };
            let error = catalog.create(&aged, &limits()).unwrap_err();
            assert!(matches!(error, CatalogError::RetentionMsTooLarge { .. }), "{error}");
            assert!(error.to_string().contains(&RETENTION_MS_MAX.to_string()), "{error}");
            assert_eq!(error.http_status(), 400);
        }
        let sized = NewStream { retention_bytes: Some(u64::MAX), ..request("sized", 1) };
        let error = catalog.create(&sized, &limits()).unwrap_err();
        assert!(matches!(error, CatalogError::RetentionBytesTooLarge { retention_bytes_max: 16777216, .. }));
        let at_most =
            NewStream { retention_bytes: Some(1 << 24), retention_ms: Some(RETENTION_MS_MAX), ..request("max", 1) };
        assert_eq!(catalog.create(&at_most, &limits()).unwrap().retention_ms, RETENTION_MS_MAX);
    }

    /// The catalog survives a save and open; a changed default partition
    /// count is refused with both numbers.
    #[test]
    fn catalog_persists_and_checks_default() {
        let dir = std::env::temp_dir().join(format!("spate-catalog-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut catalog = Catalog::open(&dir, &limits(), 8).unwrap();
        catalog.create(&request("clicks", 4), &limits()).unwrap();
        catalog.save(&dir).unwrap();
        let reopened = Catalog::open(&dir, &limits(), 8).unwrap();
        assert_eq!(reopened.streams(), catalog.streams());
        let error = Catalog::open(&dir, &limits(), 9).unwrap_err();
        assert!(error.to_string().contains("8 partitions, --partitions says 9"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn count(name: &str, stream: &str, output: &str) -> crate::aggregate::AggregateDeclaration {
        let body = format!(
            r#"{{"name":"{name}","stream":"{stream}","kind":"count","window":{{"type":"tumbling","size_ms":500}},
               "output":"{output}"}}"#
        );
        crate::aggregate::AggregateDeclaration::from_json(body.as_bytes()).unwrap()
    }

    /// A catalog with a cycle (from before they were refused) suspends the
    /// declaration that closes it: kept and saved, left out of what the
    /// shards run; deleting an aggregate of the cycle resumes it, unless a
    /// running one would close the cycle again.
    #[test]
    fn cycles_from_an_older_catalog_are_suspended_and_resumed() {
        let mut catalog = Catalog::with_default(&limits(), 4).unwrap();
        for declaration in [count("ab", "a", "b"), count("ba", "b", "a"), count("ab2", "a", "b"), count("bc", "b", "c")]
        {
            catalog.add_aggregate(declaration);
        }
        let suspended = catalog.suspend_cycles();
        let names: Vec<&str> = suspended.iter().map(|(declaration, _)| declaration.name.as_str()).collect();
        assert_eq!(names, ["ba"]);
        assert_eq!(catalog.suspended("ba").unwrap().to_string(), "cycle: a -> b -> a (aggregates ab, ba)");
        let running: Vec<String> = catalog.running().aggregates().iter().map(|held| held.name.clone()).collect();
        assert_eq!(running, ["ab", "ab2", "bc"]);
        assert_eq!(catalog.aggregates().len(), 4, "kept in the catalog, and in streams.json");
        assert!(serde_json::to_string(&catalog).unwrap().contains("\"ba\""));

        catalog.remove_aggregate("ab");
        assert!(catalog.resume_acyclic().is_empty(), "ab2 still makes a -> b: ba would close the cycle");
        assert!(catalog.suspended("ba").is_some());
        catalog.remove_aggregate("ab2");
        let resumed: Vec<String> = catalog.resume_acyclic().into_iter().map(|held| held.name).collect();
        assert_eq!(resumed, ["ba"]);
        assert!(catalog.suspended("ba").is_none() && catalog.running().aggregates().len() == 2);
    }

    /// Log ids tell every stream partition apart and survive restarts.
    #[test]
    fn log_ids_are_unique_per_stream_partition() {
        let mut catalog = Catalog::with_default(&limits(), 4).unwrap();
        let clicks = catalog.create(&request("clicks", 4), &limits()).unwrap();
        let default = catalog.get(DEFAULT_STREAM).unwrap();
        assert_ne!(default.log_id(1), clicks.log_id(1));
        assert_eq!(clicks.log_id(3), (1 << 32) | 3);
        assert_eq!(clicks.global(3), 7);
    }
}
