//! `POST /streams`, `GET /streams`, `DELETE /streams/NAME`.
//!
//! The admin side holds the one catalog that changes, and runs each change
//! while holding its lock, one at a time.
//!
//! A create adds the stream to the catalog, writes the catalog, has every
//! shard install it (open the partitions it owns), then has every shard
//! activate it; only then may ingest route to it, so no batch reaches an
//! owner that has not opened its partition. A create that fails half-way
//! is rolled back as a delete.
//!
//! A delete is atomic across a crash ([`crate::stream`] has the on-disk
//! side): the catalog is saved with the stream moved to its `deleting`
//! tombstone first (from then on the stream is deleted, and a start
//! finishes what a crash interrupted); then every shard deactivates it
//! (ingest stops routing to it, its subscribers and members get `ERR
//! stream_deleted` at once) and starts a fence; then every shard drops its
//! partitions; then its directories go to the trash; then the tombstone is
//! removed; the trash is emptied in the background. The stream's partition
//! ids are free for a new stream once every shard's fence reported that
//! nothing it routed to the deleted stream is still in flight
//! ([`Fence`]): checked before each create.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::admin::{AdminState, ShardUnavailable, ask_all_within, collect_partitions};
use crate::config::Storage;
use crate::runtime::log;
use crate::shard::control::{ControlRequest, StreamChange};
use crate::shard::streams::InstallError;
use crate::stream::{Catalog, CatalogError, NewStream, StreamSpec};

/// How long a shard may take to install or drop a stream (opening or
/// closing the files of every partition it owns).
const STREAM_CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a create that finds no room waits for deleted streams' fences
/// before it says so.
const FENCE_WAIT: Duration = Duration::from_secs(5);
/// A delete slower than this is logged (it holds the catalog lock).
const SLOW_DELETE: Duration = Duration::from_secs(1);

/// What went wrong with a stream request, and its HTTP status.
#[derive(Debug)]
pub struct Failure {
    pub status: u16,
    pub message: String,
}

impl From<CatalogError> for Failure {
    fn from(error: CatalogError) -> Failure {
        Failure { status: error.http_status(), message: format!("{error}\n") }
    }
}

impl From<InstallError> for Failure {
    fn from(error: InstallError) -> Failure {
        Failure { status: error.http_status(), message: format!("{error}\n") }
    }
}

impl From<ShardUnavailable> for Failure {
    fn from(error: ShardUnavailable) -> Failure {
        Failure { status: 503, message: error.to_string() }
    }
}

/// A deleted stream's range, waiting for every shard's fence: each shard
/// sends one `()` once nothing it routed to the stream is in flight.
pub struct Fence {
    base: u32,
    partitions: u32,
    done: flume::Receiver<()>,
    outstanding: usize,
}

impl Fence {
    /// Counts the fences that reported; true once every shard's did.
    fn poll(&mut self) -> bool {
        while self.outstanding > 0 && self.done.try_recv().is_ok() {
            self.outstanding -= 1;
        }
        self.outstanding == 0
    }
}

/// Releases the ranges whose fences are done; with `wait`, waits up to
/// [`FENCE_WAIT`] for the others first. Returns whether any was released.
async fn release_fenced(state: &AdminState, catalog: &mut Catalog, wait: bool) -> bool {
    let mut fences = std::mem::take(&mut *state.fences.lock().unwrap_or_else(|poison| poison.into_inner()));
    if wait {
        let deadline = tokio::time::Instant::now() + FENCE_WAIT;
        for fence in &mut fences {
            while !fence.poll() {
                match tokio::time::timeout_at(deadline, fence.done.recv_async()).await {
                    Ok(Ok(())) => fence.outstanding -= 1,
                    Ok(Err(_)) | Err(_) => break,
                }
            }
        }
    }
    let before = fences.len();
    fences.retain_mut(|fence| {
        let done = fence.poll();
        if done {
            catalog.release(fence.base, fence.partitions);
        }
        !done
    });
    let released = fences.len() < before;
    state.fences.lock().unwrap_or_else(|poison| poison.into_inner()).extend(fences);
    released
}

/// A stream change asked for by a shard (a Kafka client's CreateTopics,
/// DeleteTopics or auto-creation): carried out by the same code as `POST
/// /streams` and `DELETE /streams/NAME`, on the admin thread, which holds the
/// catalog.
pub enum StreamCommand {
    Create { name: String, partitions: u32, reply: flume::Sender<Result<(), Failure>> },
    Delete { name: String, reply: flume::Sender<Result<(), Failure>> },
}

/// Serves shards' stream commands until every sender is gone, one at a time
/// (each holds the catalog lock anyway).
pub async fn serve_commands(state: std::sync::Arc<AdminState>, commands: flume::Receiver<StreamCommand>) {
    while let Ok(command) = commands.recv_async().await {
        match command {
            StreamCommand::Create { name, partitions, reply } => {
                let body = json!({ "name": name, "partitions": partitions }).to_string();
                let _ = reply.send(create(&state, body.as_bytes()).await.map(drop));
            }
            StreamCommand::Delete { name, reply } => {
                let _ = reply.send(delete(&state, &name).await.map(drop));
            }
        }
    }
}

/// `POST /streams`: creates a stream from a JSON body (in a cluster,
/// through the cluster's catalog: [`crate::admin::replicated`]).
pub async fn create(state: &AdminState, body: &[u8]) -> Result<String, Failure> {
    let request: NewStream = serde_json::from_slice(body).map_err(|error| Failure {
        status: 400,
        message: format!(
            "bad_request: {error} (expected {{\"name\", \"partitions\", \"retention_bytes\"?, \"retention_ms\"?, \"partitioner\"?: \"xxh3\" | \"murmur2\", \"replication_factor\"?}})\n"
        ),
    })?;
    if state.replicated.is_some() {
        return crate::admin::replicated::create(state, request).await;
    }
    let mut catalog = state.catalog.lock().await;
    let spec = create_locked(state, &mut catalog, &request, None).await.map_err(ChangeError::into_failure)?;
    tell_cluster(state, &catalog);
    Ok(serde_json::to_string_pretty(&spec).expect("a spec serializes"))
}

/// Why a create or delete did not happen.
pub(crate) enum ChangeError {
    /// The catalog could not be saved: nothing changed, it may be tried again.
    NotSaved(Failure),
    /// Refused, or failed and undone (or, for a delete, done with its files
    /// left for the next start).
    Failed(Failure),
}

impl ChangeError {
    pub(crate) fn into_failure(self) -> Failure {
        match self {
            ChangeError::NotSaved(failure) | ChangeError::Failed(failure) => failure,
        }
    }
}

/// The validated stream `request` would make, without creating it: the
/// settings it resolves to here (retention defaults of this node).
pub(crate) async fn check_create(state: &AdminState, request: &NewStream) -> Result<StreamSpec, Failure> {
    let mut catalog = state.catalog.lock().await;
    let limits = state.config.catalog_limits();
    Ok(making_room(state, &mut catalog, |catalog| catalog.clone().create(request, &limits)).await?)
}

/// Runs `create` on the catalog once the deletes whose fences are down are
/// released, and once more, after waiting for the others, if it found no
/// room.
async fn making_room(
    state: &AdminState,
    catalog: &mut Catalog,
    create: impl Fn(&mut Catalog) -> Result<StreamSpec, CatalogError>,
) -> Result<StreamSpec, CatalogError> {
    release_fenced(state, catalog, false).await;
    match create(catalog) {
        Err(CatalogError::NoRoom { .. }) if release_fenced(state, catalog, true).await => create(catalog),
        created => created,
    }
}

/// Saves the catalog as having applied catalog-log entry `replicated_index`
/// (in a cluster; `None` keeps its index); on a failed save the index is
/// as it was, and the caller takes its change back.
fn save_at(state: &AdminState, catalog: &mut Catalog, replicated_index: Option<u64>) -> Result<(), CatalogError> {
    let index_before = catalog.replicated_index();
    if let Some(index) = replicated_index {
        catalog.set_replicated_index(index);
    }
    save(state, catalog).inspect_err(|_| catalog.set_replicated_index(index_before))
}

/// Creates a stream with the catalog lock held: adds it, saves the catalog
/// (with `replicated_index`, the catalog-log entry this is, in a cluster),
/// has every shard install and activate it; a failed install is undone as
/// a delete.
pub(crate) async fn create_locked(
    state: &AdminState,
    catalog: &mut Catalog,
    request: &NewStream,
    replicated_index: Option<u64>,
) -> Result<StreamSpec, ChangeError> {
    let limits = state.config.catalog_limits();
    let created = making_room(state, catalog, |catalog| catalog.create(request, &limits)).await;
    let spec = created.map_err(|error| ChangeError::Failed(error.into()))?;
    if let Err(error) = save_at(state, catalog, replicated_index) {
        catalog.undo_create(spec.id);
        return Err(ChangeError::NotSaved(error.into()));
    }
    if let Err(failure) = install(state, &spec).await {
        // Some shards may have opened its partitions: take it back as a
        // delete, so nothing of it stays half there.
        let undone = match catalog.begin_delete(&spec.name) {
            Ok(spec) => finish_delete(state, catalog, &spec).await.err(),
            Err(error) => Some(error.into()),
        };
        let note = undone.map(|undo| format!("; undoing it failed too: {}", undo.message)).unwrap_or_default();
        let message = format!("{}{note}", failure.message);
        return Err(ChangeError::Failed(Failure { status: failure.status, message }));
    }
    Ok(spec)
}

/// Gives the cluster thread the streams now in the catalog: it hosts the
/// Raft groups of the replicated ones ([`crate::replication::node`]). A
/// full request queue only delays that until the next change; the cluster
/// thread also gets the catalog at start.
pub(crate) fn tell_cluster(state: &AdminState, catalog: &crate::stream::Catalog) {
    if catalog.streams().iter().any(StreamSpec::is_replicated) || state.config.cluster_address().is_some() {
        let _ = state.cluster.try_send(crate::cluster::ClusterRequest::Streams(catalog.streams().to_vec()));
    }
}

/// Has every shard install `spec`, then activate it.
async fn install(state: &AdminState, spec: &StreamSpec) -> Result<(), Failure> {
    let installed = ask_all_within(
        state,
        |reply| ControlRequest::Stream(StreamChange::Install { spec: spec.clone(), reply }),
        STREAM_CHANGE_TIMEOUT,
    )
    .await?;
    if let Some(error) = installed.into_iter().find_map(Result::err) {
        return Err(error.into());
    }
    let id = spec.id;
    ask_all_within(state, |reply| ControlRequest::Stream(StreamChange::Activate { id, reply }), STREAM_CHANGE_TIMEOUT)
        .await?;
    Ok(())
}

/// `DELETE /streams/NAME` (in a cluster, through the cluster's catalog:
/// [`crate::admin::replicated`]).
pub async fn delete(state: &AdminState, name: &str) -> Result<String, Failure> {
    if state.replicated.is_some() {
        return crate::admin::replicated::delete(state, name).await;
    }
    let mut catalog = state.catalog.lock().await;
    let spec = delete_locked(state, &mut catalog, name, None).await.map_err(ChangeError::into_failure)?;
    Ok(serde_json::to_string_pretty(&json!({ "deleted": spec })).expect("json serializes"))
}

/// Deletes a stream with the catalog lock held: saves its tombstone (with
/// `replicated_index` in a cluster), then finishes the delete.
pub(crate) async fn delete_locked(
    state: &AdminState,
    catalog: &mut Catalog,
    name: &str,
    replicated_index: Option<u64>,
) -> Result<StreamSpec, ChangeError> {
    let aggregates: Vec<_> = catalog.aggregates_of(name).cloned().collect();
    let spec = catalog.begin_delete(name).map_err(|error| ChangeError::Failed(error.into()))?;
    if let Err(error) = save_at(state, catalog, replicated_index) {
        catalog.undo_begin_delete(&spec);
        aggregates.into_iter().for_each(|declaration| catalog.add_aggregate(declaration));
        return Err(ChangeError::NotSaved(error.into()));
    }
    // The tombstone is durable: the stream is deleted, whatever follows.
    let started = std::time::Instant::now();
    let finished = finish_delete(state, catalog, &spec).await;
    tell_cluster(state, catalog);
    if started.elapsed() > SLOW_DELETE {
        log::warn!(stream = name, "deleting the stream took {:.1} s", started.elapsed().as_secs_f64());
    }
    if let Err(failure) = finished {
        let message = format!("{}(stream {name} is deleted; its files go at the next start)\n", failure.message);
        return Err(ChangeError::Failed(Failure { status: failure.status, message }));
    }
    Ok(spec)
}

/// Carries out a delete whose tombstone is saved: deactivate and fence,
/// drop, move the files to the trash, remove the tombstone.
async fn finish_delete(state: &AdminState, catalog: &mut Catalog, spec: &StreamSpec) -> Result<(), Failure> {
    let id = spec.id;
    let (fenced, done) = flume::bounded(state.controls.len());
    let deactivate = |reply| ControlRequest::Stream(StreamChange::Deactivate { id, reply, fenced: fenced.clone() });
    ask_all_within(state, deactivate, STREAM_CHANGE_TIMEOUT).await?;
    let fence = Fence { base: spec.base, partitions: spec.partitions, done, outstanding: state.controls.len() };
    state.fences.lock().unwrap_or_else(|poison| poison.into_inner()).push(fence);
    // A move started before the deactivation may be known to its old owner
    // only (the thief learns of it from a frame still in flight): every
    // shard settles first, so no partition of the stream arrives after its
    // thief has dropped the stream ([`crate::shard::streams`]).
    ask_all_within(state, |reply| ControlRequest::Stream(StreamChange::Settle { id, reply }), STREAM_CHANGE_TIMEOUT)
        .await?;
    ask_all_within(state, |reply| ControlRequest::Stream(StreamChange::Drop { id, reply }), STREAM_CHANGE_TIMEOUT)
        .await?;
    if state.config.storage == Storage::Disk {
        let data_dir = state.config.data_dir.clone();
        let trashed = spec.clone();
        let moved =
            tokio::task::spawn_blocking(move || crate::stream::trash::move_stream_to_trash(&data_dir, &trashed));
        let moved = moved.await.map_err(|error| Failure { status: 500, message: format!("{error}\n") })?;
        moved?;
    }
    catalog.finish_delete(id);
    save(state, catalog)?;
    if state.config.storage == Storage::Disk {
        let data_dir = state.config.data_dir.clone();
        drop(tokio::task::spawn_blocking(move || crate::stream::trash::empty_trash(&data_dir)));
    }
    Ok(())
}

/// `GET /streams`: each stream with its settings, bytes, the events it
/// holds (`events`: next minus earliest offset, over its partitions), the
/// events this process ingested into it (`events_ingested`, from 0 at
/// start) and the next offset of every partition.
pub async fn list(state: &AdminState) -> Result<String, Failure> {
    let specs: Vec<StreamSpec> = state.catalog.lock().await.streams().to_vec();
    let partitions = collect_every_partition(state, &specs).await?;
    let mut by_stream: BTreeMap<&str, Vec<&crate::shard::control::PartitionInfo>> = BTreeMap::new();
    for info in &partitions {
        by_stream.entry(info.stream.as_str()).or_default().push(info);
    }
    let streams: Vec<_> = specs
        .iter()
        .map(|spec| {
            let infos = by_stream.get(spec.name.as_str()).map(Vec::as_slice).unwrap_or(&[]);
            let mut next_offsets = vec![serde_json::Value::Null; spec.partitions as usize];
            for info in infos {
                next_offsets[info.stream_partition as usize] = json!(info.next_offset);
            }
            json!({
                "name": spec.name,
                "id": spec.id,
                "partitions": spec.partitions,
                "retention_bytes": spec.retention_bytes,
                "retention_ms": spec.retention_ms,
                "partitioner": spec.partitioner.as_str(),
                "replication_factor": spec.replication_factor,
                "disk_bytes": infos.iter().map(|info| info.disk_bytes).sum::<u64>(),
                "memory_bytes": infos.iter().map(|info| info.log_bytes).sum::<u64>(),
                "events": infos.iter().map(|info| info.next_offset - info.earliest_offset).sum::<u64>(),
                "events_ingested": infos.iter().map(|info| info.events_total).sum::<u64>(),
                "next_offsets": next_offsets,
            })
        })
        .collect();
    Ok(serde_json::to_string_pretty(&json!({ "streams": streams })).expect("json serializes"))
}

/// Asks at most this many times for a listing that names every partition.
const LISTING_ATTEMPTS_MAX: u32 = 20;
/// Between two attempts, in ms.
const LISTING_RETRY_MS: u64 = 5;

/// Every shard's partitions. A partition moving between shards is listed
/// by neither for a moment (the old owner has handed it over, the thief
/// has not installed it): ask again, 5 ms apart and at most 20 times,
/// until every partition of `specs` is there. Past that (a migration
/// stuck for 100 ms) the listing says `null` for the partition's offset.
async fn collect_every_partition(
    state: &AdminState,
    specs: &[StreamSpec],
) -> Result<Vec<crate::shard::control::PartitionInfo>, Failure> {
    let names: std::collections::HashSet<&str> = specs.iter().map(|spec| spec.name.as_str()).collect();
    let expected: usize = specs.iter().map(|spec| spec.partitions as usize).sum();
    let mut attempts = 1;
    loop {
        let partitions = collect_partitions(state).await?;
        let listed = partitions.iter().filter(|info| names.contains(info.stream.as_str())).count();
        if listed >= expected || attempts == LISTING_ATTEMPTS_MAX {
            return Ok(partitions);
        }
        attempts += 1;
        tokio::time::sleep(std::time::Duration::from_millis(LISTING_RETRY_MS)).await;
    }
}

/// Writes the catalog (disk storage), atomically and durably.
pub fn save(state: &AdminState, catalog: &Catalog) -> Result<(), CatalogError> {
    match state.config.storage {
        Storage::Disk => catalog.save(&state.config.data_dir),
        Storage::Memory => Ok(()),
    }
}
