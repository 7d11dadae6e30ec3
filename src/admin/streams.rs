//! `POST /streams`, `GET /streams`, `DELETE /streams/NAME`.
//!
//! The admin side holds the one catalog that changes. A create adds the
//! stream to the catalog, writes the catalog to the data directory, has
//! every shard install it (open the partitions it owns), then has every
//! shard activate it; only then may ingest route to it, so no batch reaches
//! an owner that has not opened its partition. A delete deactivates the
//! stream on every shard (ingest refuses it from the next chunk), then has
//! every shard drop its partitions and delete their files, then writes the
//! catalog. Each runs while holding the catalog lock, one at a time.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::admin::{AdminState, ShardUnavailable, ask_all_within, collect_partitions};
use crate::config::Storage;
use crate::shard::control::{ControlRequest, StreamRequest};
use crate::stream::{CatalogError, StreamRequest as CreateRequest, StreamSpec};

/// How long a shard may take to install or drop a stream (opening or
/// deleting the files of every partition it owns).
const STREAM_CHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// What went wrong with a stream request, and its HTTP status.
pub struct Failure {
    pub status: u16,
    pub message: String,
}

impl From<CatalogError> for Failure {
    fn from(error: CatalogError) -> Failure {
        Failure { status: error.http_status(), message: format!("{error}\n") }
    }
}

impl From<ShardUnavailable> for Failure {
    fn from(error: ShardUnavailable) -> Failure {
        Failure { status: 503, message: error.to_string() }
    }
}

/// `POST /streams`: creates a stream from a JSON body.
pub async fn create(state: &AdminState, body: &[u8]) -> Result<String, Failure> {
    let request: CreateRequest = serde_json::from_slice(body).map_err(|error| Failure {
        status: 400,
        message: format!(
            "bad_request: {error} (expected {{\"name\", \"partitions\", \"retention_bytes\"?, \"retention_ms\"?}})\n"
        ),
    })?;
    let mut catalog = state.catalog.lock().await;
    let spec = catalog.create(&request, &state.config.catalog_limits())?;
    if let Err(error) = save(state, &catalog) {
        catalog.remove(&spec.name).expect("just created");
        return Err(error.into());
    }
    let installed = ask_all_within(
        state,
        |reply| ControlRequest::Stream(StreamRequest::Install { spec: spec.clone(), reply }),
        STREAM_CHANGE_TIMEOUT,
    )
    .await?;
    if let Some(Err(error)) = installed.into_iter().find(Result::is_err) {
        return Err(Failure { status: 500, message: format!("installing stream {}: {error}\n", spec.name) });
    }
    let id = spec.id;
    ask_all_within(state, |reply| ControlRequest::Stream(StreamRequest::Activate { id, reply }), STREAM_CHANGE_TIMEOUT)
        .await?;
    Ok(serde_json::to_string_pretty(&spec).expect("a spec serializes"))
}

/// `DELETE /streams/NAME`.
pub async fn delete(state: &AdminState, name: &str) -> Result<String, Failure> {
    let mut catalog = state.catalog.lock().await;
    let spec = catalog.remove(name)?;
    let id = spec.id;
    let deactivate = |reply| ControlRequest::Stream(StreamRequest::Deactivate { id, reply });
    ask_all_within(state, deactivate, STREAM_CHANGE_TIMEOUT).await?;
    let dropped =
        ask_all_within(state, |reply| ControlRequest::Stream(StreamRequest::Drop { id, reply }), STREAM_CHANGE_TIMEOUT)
            .await?;
    save(state, &catalog)?;
    if let Some(Err(error)) = dropped.into_iter().find(Result::is_err) {
        return Err(Failure { status: 500, message: format!("deleting stream {name}: {error}\n") });
    }
    if state.config.storage == Storage::Disk
        && let Ok(dir) = crate::storage::dir::stream_dir(&state.config.data_dir, name)
    {
        let _ = std::fs::remove_dir_all(dir);
        // Its consumer groups' offsets go with it.
        let _ = std::fs::remove_dir_all(crate::group::store::groups_dir(&state.config.data_dir).join(name));
    }
    Ok(serde_json::to_string_pretty(&json!({ "deleted": spec })).expect("json serializes"))
}

/// `GET /streams`: each stream with its settings, bytes, the events it
/// holds (`events`: next minus earliest offset, over its partitions), the
/// events this process ingested into it (`events_ingested`, from 0 at
/// start) and the next offset of every partition.
pub async fn list(state: &AdminState) -> Result<String, Failure> {
    let specs: Vec<StreamSpec> = state.catalog.lock().await.streams().to_vec();
    let partitions = collect_partitions(state).await?;
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

fn save(state: &AdminState, catalog: &crate::stream::Catalog) -> Result<(), CatalogError> {
    match state.config.storage {
        Storage::Disk => catalog.save(&state.config.data_dir),
        Storage::Memory => Ok(()),
    }
}
