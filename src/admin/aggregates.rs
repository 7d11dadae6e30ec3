//! Keyed aggregates over HTTP:
//!
//! * `POST /streams/NAME/aggregates`: declares an aggregate on stream NAME
//!   (the body is the declaration of [`crate::aggregate`]; `stream` may be
//!   left out). The output stream must exist. The declaration is written to
//!   the catalog (`streams.json`), every shard adds it to the partitions it
//!   owns, and on disk each writes the first checkpoint before the answer
//!   (`201`, the declaration as stored). Aggregate names are unique across
//!   streams (they name `/aggregates/NAME`). A declaration whose output
//!   leads back to its stream through the aggregates already declared is
//!   refused with `409` naming the cycle (`cycle: in -> out -> in`; see
//!   [`crate::aggregate::cycle_closed_by`]).
//! * `GET /streams/NAME/aggregates`: the stream's aggregates, each with its
//!   keys, open windows, memory and counters summed over partitions, and
//!   `suspended` (the cycle) for one a catalog from before cycles were
//!   refused holds that is kept but not run.
//! * `DELETE /streams/NAME/aggregates/AGG`: drops the aggregate and its
//!   state; a suspended aggregate that no longer closes a cycle starts.
//! * `GET /aggregates/AGG?key=K`: one key's open windows and last closed
//!   window, from the shard that owns the key's partition (`404` when the
//!   aggregate holds nothing for it). `K` is percent-decoded.
//! * `GET /aggregates/AGG/top?n=N`: the `N` (default 10, at most
//!   [`crate::aggregate::TOP_N_MAX`]) keys with the largest value (running
//!   aggregates) or largest last closed window, merged across shards.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::admin::streams::{Failure, save};
use crate::admin::{AdminState, ShardUnavailable, ask_all, ask_all_within};
use crate::aggregate::{AGGREGATES_PER_STREAM_MAX, AggregateDeclaration, AggregateStats, KeyView, TOP_N_MAX};
use crate::shard::aggregates::AggregateRequest;
use crate::shard::control::ControlRequest;

/// How long a shard may take to declare an aggregate (a checkpoint round,
/// which waits for a synced commit).
const DECLARE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a key query waits for the shards.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// The most bytes of a `key=` query value.
const QUERY_KEY_BYTES_MAX: usize = 4096;

/// Whether `path` is one of this module's.
pub fn matches(path: &str) -> bool {
    path.starts_with("/aggregates/") || (path.starts_with("/streams/") && path.contains("/aggregates"))
}

/// Answers a request on one of this module's paths: `(status, body)`.
pub async fn route(
    state: &AdminState,
    method: &hyper::Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Result<(u16, String), Failure> {
    use hyper::Method;
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        (&Method::POST, ["streams", stream, "aggregates"]) => create(state, stream, body).await.map(|body| (201, body)),
        (&Method::GET, ["streams", stream, "aggregates"]) => list(state, stream).await.map(|body| (200, body)),
        (&Method::DELETE, ["streams", stream, "aggregates", name]) => {
            delete(state, stream, name).await.map(|body| (200, body))
        }
        (&Method::GET, ["aggregates", name]) => key_view(state, name, query).await.map(|body| (200, body)),
        (&Method::GET, ["aggregates", name, "top"]) => top(state, name, query).await.map(|body| (200, body)),
        _ => Err(Failure { status: 404, message: format!("not found: {method} {path}\n") }),
    }
}

fn bad_request(message: String) -> Failure {
    Failure { status: 400, message: format!("{message}\n") }
}

async fn create(state: &AdminState, stream: &str, body: &[u8]) -> Result<String, Failure> {
    let mut value: Value =
        serde_json::from_slice(body).map_err(|error| bad_request(format!("bad_request: not JSON: {error}")))?;
    if let Value::Object(map) = &mut value {
        match map.get("stream") {
            None => {
                map.insert("stream".into(), Value::String(stream.to_string()));
            }
            Some(Value::String(named)) if named == stream => {}
            Some(other) => {
                return Err(bad_request(format!("bad_request: stream: {other} is not {stream:?} (the URL)")));
            }
        }
    }
    let declaration =
        AggregateDeclaration::from_value(value).map_err(|error| bad_request(format!("bad_declaration: {error}")))?;
    let mut catalog = state.catalog.lock().await;
    let Some(spec) = catalog.get(stream) else {
        return Err(Failure { status: 404, message: format!("unknown_stream: {stream}\n") });
    };
    if spec.is_replicated() {
        return Err(bad_request(format!(
            "replicated_stream: {stream:?} is replicated over the cluster, and aggregates run per node on the \
             events it stores, not on a replicated stream's committed events yet; declare it on a stream with \
             replication_factor 1"
        )));
    }
    if let Some(output) = &declaration.output
        && catalog.get(output).is_none()
    {
        return Err(bad_request(format!("unknown_output: stream {output:?} does not exist; create it first")));
    }
    if catalog.aggregates().iter().any(|held| held.name == declaration.name) {
        let message = format!("exists: aggregate {:?} already exists\n", declaration.name);
        return Err(Failure { status: 409, message });
    }
    // Suspended aggregates count: deleting one must not be what lets a new
    // cycle through.
    if let Some(cycle) = crate::aggregate::cycle_closed_by(catalog.aggregates(), &declaration) {
        let message = format!("{cycle}: an aggregate's output must not lead back to its own input\n");
        return Err(Failure { status: 409, message });
    }
    let count = catalog.aggregates_of(stream).count();
    if count >= AGGREGATES_PER_STREAM_MAX {
        return Err(bad_request(format!(
            "too_many_aggregates: stream {stream} has {count}, at most {AGGREGATES_PER_STREAM_MAX}"
        )));
    }
    catalog.add_aggregate(declaration.clone());
    if let Err(error) = save(state, &catalog) {
        catalog.remove_aggregate(&declaration.name);
        return Err(error.into());
    }
    declare_on_shards(state, &declaration).await?;
    Ok(serde_json::to_string_pretty(&declaration.to_value()).expect("json serializes"))
}

/// Has every shard start `declaration` (and write its first checkpoint).
async fn declare_on_shards(state: &AdminState, declaration: &AggregateDeclaration) -> Result<(), Failure> {
    let declared = ask_all_within(
        state,
        |reply| ControlRequest::Aggregate(AggregateRequest::Declare { declaration: declaration.clone(), reply }),
        DECLARE_TIMEOUT,
    )
    .await?;
    if let Some(error) = declared.into_iter().find_map(Result::err) {
        let message = format!("{error} (declaring aggregate {})\n", declaration.name);
        return Err(Failure { status: error.http_status(), message });
    }
    Ok(())
}

async fn list(state: &AdminState, stream: &str) -> Result<String, Failure> {
    let declarations: Vec<(AggregateDeclaration, Option<String>)> = {
        let catalog = state.catalog.lock().await;
        if catalog.get(stream).is_none() {
            return Err(Failure { status: 404, message: format!("unknown_stream: {stream}\n") });
        }
        let suspended = |name: &str| catalog.suspended(name).map(ToString::to_string);
        catalog.aggregates_of(stream).map(|declaration| (declaration.clone(), suspended(&declaration.name))).collect()
    };
    let stats = collect_stats(state).await?;
    let mut by_name: BTreeMap<&str, Vec<&AggregateStats>> = BTreeMap::new();
    for entry in &stats {
        by_name.entry(entry.aggregate.as_str()).or_default().push(entry);
    }
    let aggregates: Vec<Value> = declarations
        .iter()
        .map(|(declaration, suspended)| {
            let entries = by_name.get(declaration.name.as_str()).map(Vec::as_slice).unwrap_or(&[]);
            let sum = |read: fn(&AggregateStats) -> u64| entries.iter().map(|entry| read(entry)).sum::<u64>();
            json!({
                "declaration": declaration.to_value(),
                "suspended": suspended,
                "partitions": entries.len(),
                "keys": sum(|entry| entry.keys),
                "open_windows": sum(|entry| entry.open_windows),
                "memory_bytes": sum(|entry| entry.memory_bytes),
                "events_applied": sum(|entry| entry.counters.events_applied),
                "value_malformed": sum(|entry| entry.counters.value_malformed),
                "time_malformed": sum(|entry| entry.counters.time_malformed),
                "late_events_dropped": sum(|entry| entry.counters.late_events_dropped),
                "late_partial_events": sum(|entry| entry.counters.late_partial_events),
                "keys_refused": sum(|entry| entry.counters.keys_refused),
                "keys_expired": sum(|entry| entry.counters.keys_expired),
                "windows_closed": sum(|entry| entry.counters.windows_closed),
            })
        })
        .collect();
    Ok(serde_json::to_string_pretty(&json!({ "aggregates": aggregates })).expect("json serializes"))
}

async fn collect_stats(state: &AdminState) -> Result<Vec<AggregateStats>, Failure> {
    let stats = ask_all(state, |reply| ControlRequest::Aggregate(AggregateRequest::Stats { reply })).await?;
    Ok(stats.into_iter().flatten().collect())
}

async fn delete(state: &AdminState, stream: &str, name: &str) -> Result<String, Failure> {
    let mut catalog = state.catalog.lock().await;
    let held = catalog.aggregates().iter().find(|held| held.name == name && held.stream == stream).cloned();
    let Some(declaration) = held else {
        return Err(Failure { status: 404, message: format!("unknown_aggregate: {name} on stream {stream}\n") });
    };
    catalog.remove_aggregate(name);
    if let Err(error) = save(state, &catalog) {
        catalog.add_aggregate(declaration);
        return Err(error.into());
    }
    let name = name.to_string();
    ask_all(state, |reply| ControlRequest::Aggregate(AggregateRequest::Remove { name: name.clone(), reply })).await?;
    let resumed = catalog.resume_acyclic();
    for declaration in &resumed {
        declare_on_shards(state, declaration).await?;
    }
    let resumed: Vec<&str> = resumed.iter().map(|declaration| declaration.name.as_str()).collect();
    let body = json!({ "deleted": declaration.to_value(), "resumed": resumed });
    Ok(serde_json::to_string_pretty(&body).expect("json serializes"))
}

async fn check_known(state: &AdminState, name: &str) -> Result<(), Failure> {
    if state.catalog.lock().await.aggregates().iter().any(|held| held.name == name) {
        Ok(())
    } else {
        Err(Failure { status: 404, message: format!("unknown_aggregate: {name}\n") })
    }
}

async fn key_view(state: &AdminState, name: &str, query: Option<&str>) -> Result<String, Failure> {
    check_known(state, name).await?;
    let key = query_param(query, "key")?.ok_or_else(|| bad_request("bad_request: ?key=K is required".into()))?;
    let key_text = String::from_utf8_lossy(&key).into_owned();
    match ask_owner(state, name, &key).await? {
        Some(view) => {
            let mut value = serde_json::to_value(&view).expect("a view serializes");
            value["key"] = Value::String(key_text);
            Ok(serde_json::to_string_pretty(&value).expect("json serializes"))
        }
        None => Err(Failure {
            status: 404,
            message: format!("no_state: aggregate {name} holds nothing for {key_text:?}\n"),
        }),
    }
}

/// Asks every shard for the key's view and answers with the first that
/// holds it (only the owner of the key's partition does): the round trip is
/// the owner's, not the slowest shard's.
async fn ask_owner(state: &AdminState, name: &str, key: &[u8]) -> Result<Option<KeyView>, Failure> {
    let (reply, replies) = flume::bounded(state.controls.len());
    let deadline = tokio::time::Instant::now() + QUERY_TIMEOUT;
    for (shard, control) in state.controls.iter().enumerate() {
        let request = AggregateRequest::Query { name: name.to_string(), key: key.to_vec(), reply: reply.clone() };
        // A full control queue is a busy shard: wait for room until the deadline.
        match tokio::time::timeout_at(deadline, control.send_async(ControlRequest::Aggregate(request))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ShardUnavailable::NotRunning { shard }.into()),
            Err(_) => return Err(ShardUnavailable::Timeout { shard }.into()),
        }
    }
    drop(reply);
    for shard in 0..state.controls.len() {
        match tokio::time::timeout_at(deadline, replies.recv_async()).await {
            Ok(Ok(Some(view))) => return Ok(Some(view)),
            Ok(Ok(None)) => {}
            Ok(Err(_)) => return Err(ShardUnavailable::NotRunning { shard }.into()),
            Err(_) => return Err(ShardUnavailable::Timeout { shard }.into()),
        }
    }
    Ok(None)
}

async fn top(state: &AdminState, name: &str, query: Option<&str>) -> Result<String, Failure> {
    check_known(state, name).await?;
    let n = match query_param(query, "n")? {
        None => 10,
        Some(text) => std::str::from_utf8(&text)
            .ok()
            .and_then(|text| text.parse::<usize>().ok())
            .filter(|n| (1..=TOP_N_MAX).contains(n))
            .ok_or_else(|| bad_request(format!("bad_request: n must be 1 to {TOP_N_MAX}")))?,
    };
    let make = |reply| ControlRequest::Aggregate(AggregateRequest::Top { name: name.to_string(), n, reply });
    let lists = ask_all(state, make).await?;
    let merged = crate::aggregate::merge_top(lists, n);
    Ok(serde_json::to_string_pretty(&json!({ "aggregate": name, "top": merged })).expect("json serializes"))
}

/// The percent-decoded value of `name` in a query string (`+` is a space).
fn query_param(query: Option<&str>, name: &str) -> Result<Option<Vec<u8>>, Failure> {
    let Some(query) = query else { return Ok(None) };
    for pair in query.split('&') {
        let (field, value) = pair.split_once('=').unwrap_or((pair, ""));
        if field != name {
            continue;
        }
        if value.len() > 3 * QUERY_KEY_BYTES_MAX {
            return Err(bad_request(format!("bad_request: {name} is over {QUERY_KEY_BYTES_MAX} bytes")));
        }
        return percent_decode(value.as_bytes())
            .map(Some)
            .ok_or_else(|| bad_request(format!("bad_request: {name}: bad percent-encoding")));
    }
    Ok(None)
}

fn percent_decode(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut position = 0;
    while position < text.len() {
        match text[position] {
            b'%' => {
                let hex = std::str::from_utf8(text.get(position + 1..position + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                position += 3;
            }
            b'+' => {
                out.push(b' ');
                position += 1;
            }
            byte => {
                out.push(byte);
                position += 1;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Query values are percent-decoded, `+` is a space, and bad escapes are refused.
    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode(b"user%2042+x"), Some(b"user 42 x".to_vec()));
        assert_eq!(percent_decode(b"%zz"), None);
        assert_eq!(percent_decode(b"%4"), None);
        assert_eq!(query_param(Some("n=3&key=a%26b"), "key").ok().flatten(), Some(b"a&b".to_vec()));
    }
}
