//! The cluster's catalog: in a cluster (`--cluster`/`--join`) a stream
//! created or deleted through the admin API of any node takes effect on
//! every node, in the same order everywhere.
//!
//! A change is a [`Command`] proposed to the catalog group, one Raft group
//! of the cluster ([`crate::replication::node`], "The catalog group"); every
//! node holds it (up to [`CATALOG_VOTERS_MAX`] voters, every other live node
//! a learner), and every node applies its committed commands in log order
//! through the same code as a single node's `POST /streams` and `DELETE
//! /streams/NAME` ([`super::streams`]), so each change is as atomic across a
//! crash as there. The catalog file saves, with each change, the index of
//! the log entry it applied (`replicated_index`), so a restarted node applies
//! the entries after it, none twice; a node that joins later gets the whole
//! log (never compacted) and replays it.
//!
//! # A request
//!
//! 1. The node the request came to checks it against its own catalog and
//!    resolves its settings (retention defaults), so every node creates the
//!    stream with the same ones: a bad request, an existing stream (409) or
//!    an unknown one (404) is answered at once, as on a single node.
//! 2. It proposes the command (forwarded to the catalog group's leader when
//!    this node does not lead it) and, while the group has no leader or the
//!    leader did not take it, proposes it again every [`RETRY_MS`]; one not
//!    answered within [`ATTEMPT_TIMEOUT_MS`] (its leader died) is proposed
//!    again too. A command carries a random request id, and the catalog
//!    keeps the ids of the last
//!    [`REPLICATED_REQUESTS_MAX`](crate::stream::REPLICATED_REQUESTS_MAX) it applied
//!    (saved with it), so a command committed twice is applied once, on
//!    every node alike.
//! 3. The answer comes once the command is committed and applied to this
//!    node's catalog (a create is installed and active on every shard: an
//!    ingest right after it finds the stream), with the outcome of its
//!    apply here: 201 (200 for a delete) and the stream, or the error.
//! 4. Not committed within [`COMMIT_TIMEOUT_MS`] (no majority of the
//!    catalog's voters reachable): `503 no_quorum`. A command a leader took
//!    may still commit after that (Raft cannot take it back), so the answer
//!    says to look at `GET /streams`.
//!
//! # Conflicts
//!
//! Every node applies the same commands in the same order, so two creates
//! of one name (on two nodes, at once) end alike everywhere: the first
//! creates the stream, the second is refused on every node (`409 exists`
//! to its requester when the settings are the same, `409 conflict` when
//! not). A node whose own catalog already has a stream of that name from
//! before it was in the cluster (or before this release) keeps its stream:
//! with the same settings it is adopted as the cluster's; with other
//! settings the node does not apply the create, logs an error naming both,
//! counts it (`GET /cluster`'s `catalog.conflicts`, with the last one's
//! message) and answers a requester on it with `409 conflict`. A node
//! that cannot apply a command for a reason of its own (no room under its
//! `--partitions-max`, a shard that fails to install) does the same. A
//! catalog file that cannot be saved (a full disk) stops the apply: the
//! entry is tried again every 500 ms, and the later ones wait behind it.
//!
//! # Streams with replication factor 1
//!
//! are cluster-wide too: a create on one node creates the stream on every
//! node, so a producer or subscriber finds it on any node, but each node's
//! partitions are its own (events produced on a node stay on that node, as
//! with several single nodes). `default` is each node's own (made from its
//! flags) and cannot be deleted. Aggregates are declared per node, as before.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::admin::AdminState;
use crate::admin::streams::{ChangeError, Failure, check_create, create_locked, delete_locked, tell_cluster};
use crate::cluster::ClusterRequest;
use crate::replication::node::{CATALOG_VOTERS_MAX, CatalogEntries, ProposalRefused};
use crate::runtime::log;
use crate::stream::{Catalog, CatalogError, DEFAULT_STREAM, NewStream, StreamSpec};

/// How long a request waits for its command to be committed and applied
/// here before it is answered `503 no_quorum`, in ms: more than the time a
/// dead catalog leader takes to be replaced (its death seen by the
/// membership, 5-9 s for 3 nodes, then an election of 1-2 s).
pub const COMMIT_TIMEOUT_MS: u64 = 20_000;
/// How long one proposal of a command may go unanswered before it is
/// proposed again, in ms: a forward to a leader that died meanwhile is
/// never answered (the proposal times out only after
/// [`crate::replication::node::PROPOSAL_TIMEOUT_MS`]).
pub const ATTEMPT_TIMEOUT_MS: u64 = 2_000;
/// How long a request waits before it proposes its command again after a
/// refusal (no leader yet, a leadership transfer), in ms.
pub const RETRY_MS: u64 = 100;
/// How often a request whose command is committed looks for its outcome, in ms.
const OUTCOME_POLL_MS: u64 = 5;
/// Outcomes of applied commands kept for their requesters (each a few
/// hundred bytes); the oldest go first. Requests wait for theirs only
/// [`COMMIT_TIMEOUT_MS`], so at most those of the last 10 s matter.
const OUTCOMES_MAX: usize = 256;

/// One change of the cluster's catalog, as its log entry holds it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Create a stream; every setting is resolved (none left to a node's
    /// defaults).
    Create {
        request_id: u64,
        stream: NewStream,
    },
    Delete {
        request_id: u64,
        name: String,
    },
}

impl Command {
    fn request_id(&self) -> u64 {
        match self {
            Command::Create { request_id, .. } | Command::Delete { request_id, .. } => *request_id,
        }
    }
}

/// What happened to a command on this node: the body of the answer, or the
/// failure.
type Outcome = Result<String, Failure>;

/// The admin side of the cluster's catalog.
pub struct Replicated {
    /// Committed catalog entries from the cluster thread, to apply.
    pub entries: flume::Receiver<CatalogEntries>,
    /// Outcomes of the latest commands applied, by request id; at most
    /// [`OUTCOMES_MAX`].
    outcomes: Mutex<VecDeque<(u64, Outcome)>>,
    /// Commands this node did not apply for a reason of its own (module
    /// doc, "Conflicts"), and the last one's message.
    conflicts: Mutex<(u64, Option<String>)>,
}

impl Replicated {
    pub fn new(entries: flume::Receiver<CatalogEntries>) -> Replicated {
        Replicated { entries, outcomes: Mutex::default(), conflicts: Mutex::default() }
    }

    /// Keeps the outcome of the first apply of `request_id`.
    fn record(&self, request_id: u64, outcome: Outcome) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|poison| poison.into_inner());
        if outcomes.iter().any(|(id, _)| *id == request_id) {
            return;
        }
        if outcomes.len() >= OUTCOMES_MAX {
            outcomes.pop_front();
        }
        outcomes.push_back((request_id, outcome));
    }

    fn take(&self, request_id: u64) -> Option<Outcome> {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|poison| poison.into_inner());
        let position = outcomes.iter().position(|(id, _)| *id == request_id)?;
        outcomes.remove(position).map(|(_, outcome)| outcome)
    }

    fn note_conflict(&self, message: String) {
        log::error!("{message}");
        let mut conflicts = self.conflicts.lock().unwrap_or_else(|poison| poison.into_inner());
        conflicts.0 += 1;
        conflicts.1 = Some(message);
    }

    /// `GET /cluster`'s `catalog`.
    pub fn json(&self, catalog: &Catalog) -> serde_json::Value {
        let conflicts = self.conflicts.lock().unwrap_or_else(|poison| poison.into_inner());
        json!({
            "applied_index": catalog.replicated_index(),
            "conflicts": conflicts.0,
            "last_conflict": conflicts.1,
            "voters_max": CATALOG_VOTERS_MAX,
        })
    }
}

/// `POST /streams` in a cluster (module doc, "A request").
pub async fn create(state: &AdminState, request: NewStream) -> Result<String, Failure> {
    let stream = resolved(&check_create(state, &request).await?);
    propose(state, Command::Create { request_id: rand::random(), stream }).await
}

/// `DELETE /streams/NAME` in a cluster (module doc, "A request").
pub async fn delete(state: &AdminState, name: &str) -> Result<String, Failure> {
    if name == DEFAULT_STREAM {
        return Err(CatalogError::DeleteDefault.into());
    }
    if state.catalog.lock().await.get(name).is_none() {
        return Err(CatalogError::Unknown { name: name.to_string() }.into());
    }
    propose(state, Command::Delete { request_id: rand::random(), name: name.to_string() }).await
}

/// Proposes `command` until it is taken, then waits for its outcome here;
/// `503 no_quorum` past [`COMMIT_TIMEOUT_MS`].
async fn propose(state: &AdminState, command: Command) -> Result<String, Failure> {
    let Some(replicated) = &state.replicated else {
        return Err(Failure { status: 500, message: "the catalog is not replicated on this node\n".into() });
    };
    let request_id = command.request_id();
    let bytes = serde_json::to_vec(&command).expect("a command serializes");
    let deadline = tokio::time::Instant::now() + Duration::from_millis(COMMIT_TIMEOUT_MS);
    let mut refused = None;
    while tokio::time::Instant::now() < deadline {
        let (reply, answer) = flume::bounded(1);
        let request = ClusterRequest::ProposeCatalog { command: bytes.clone(), reply };
        if state.cluster.send_async(request).await.is_err() {
            return Err(Failure { status: 503, message: "cluster_unavailable: the cluster thread is gone\n".into() });
        }
        let attempt = deadline.min(tokio::time::Instant::now() + Duration::from_millis(ATTEMPT_TIMEOUT_MS));
        match tokio::time::timeout_at(attempt, answer.recv_async()).await {
            // Committed: this node's apply records its outcome a moment later.
            Ok(Ok(Ok(()))) => {
                if let Some(outcome) = wait_for_outcome(replicated, request_id, deadline).await {
                    return outcome;
                }
                break;
            }
            Ok(Ok(Err(reason))) => {
                refused = Some(reason);
                let pause = deadline.min(tokio::time::Instant::now() + Duration::from_millis(RETRY_MS));
                tokio::time::sleep_until(pause).await;
            }
            Ok(Err(_)) => break,
            // Unanswered: proposed again (applied once, module doc).
            Err(_) => refused = Some(ProposalRefused::TimedOut),
        }
        if let Some(outcome) = replicated.take(request_id) {
            return outcome;
        }
    }
    let why = match refused {
        Some(ProposalRefused::TimedOut) => format!("no answer within {ATTEMPT_TIMEOUT_MS} ms"),
        Some(ProposalRefused::NoLeader) => "the catalog group has no leader (an election, or no majority alive)".into(),
        Some(ProposalRefused::NotAReplica) => "this node is not a member of the catalog group yet".into(),
        Some(reason) => reason.to_string(),
        None => "no answer from the cluster thread".to_string(),
    };
    Err(Failure {
        status: 503,
        message: format!(
            "no_quorum: the catalog change was not committed within {COMMIT_TIMEOUT_MS} ms (a majority of the \
             catalog group's voters must be reachable; last: {why}); a change a leader took may still take effect: \
             GET /streams shows whether it did\n"
        ),
    })
}

/// Waits until the outcome of `request_id` is recorded here, or the deadline.
async fn wait_for_outcome(replicated: &Replicated, request_id: u64, deadline: tokio::time::Instant) -> Option<Outcome> {
    loop {
        if let Some(outcome) = replicated.take(request_id) {
            return Some(outcome);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(OUTCOME_POLL_MS)).await;
    }
}

/// Applies the committed catalog entries the cluster thread hands over,
/// batch by batch, for as long as it runs.
pub async fn apply_committed(state: Arc<AdminState>, entries: flume::Receiver<CatalogEntries>) {
    while let Ok(batch) = entries.recv_async().await {
        let applied = apply_batch(&state, &batch).await;
        let _ = batch.reply.send(applied);
    }
}

/// Applies a batch in order under the catalog lock; returns the last index
/// applied (before an entry to try again later).
async fn apply_batch(state: &AdminState, batch: &CatalogEntries) -> u64 {
    let Some(replicated) = &state.replicated else { return batch.through };
    let mut catalog = state.catalog.lock().await;
    for (index, bytes) in &batch.entries {
        if *index <= catalog.replicated_index() {
            continue;
        }
        let command = match serde_json::from_slice::<Command>(bytes) {
            Ok(command) => command,
            Err(error) => {
                replicated.note_conflict(format!("catalog entry {index} is not a command this node reads: {error}"));
                continue;
            }
        };
        let request_id = command.request_id();
        match apply(state, replicated, &mut catalog, *index, command).await {
            Ok(outcome) => replicated.record(request_id, outcome),
            Err(failure) => {
                log::warn!(
                    "catalog entry {index} not applied yet (tried again in a moment): {}",
                    failure.message.trim_end()
                );
                return index - 1;
            }
        }
    }
    if catalog.replicated_index() < batch.through {
        // The entries without a change (refused, or configuration ones):
        // saved with the next change; a restart before it refuses them again.
        catalog.set_replicated_index(batch.through);
    }
    batch.through
}

/// Applies one command at `index`: its outcome, or the failure of a save
/// that changed nothing (to try again).
async fn apply(
    state: &AdminState,
    replicated: &Replicated,
    catalog: &mut Catalog,
    index: u64,
    command: Command,
) -> Result<Outcome, Failure> {
    let request_id = command.request_id();
    if !catalog.note_replicated_request(request_id) {
        let message = format!("duplicate: catalog entry {index} repeats request {request_id:x}, applied before\n");
        return Ok(Err(Failure { status: 409, message }));
    }
    let outcome = apply_new(state, replicated, catalog, index, command).await;
    if outcome.is_err() {
        catalog.forget_replicated_request(request_id);
    }
    outcome
}

/// [`apply`] of a command not applied before.
async fn apply_new(
    state: &AdminState,
    replicated: &Replicated,
    catalog: &mut Catalog,
    index: u64,
    command: Command,
) -> Result<Outcome, Failure> {
    match command {
        Command::Create { stream, .. } => {
            if let Some(existing) = catalog.get(&stream.name) {
                if same_settings(existing, &stream) {
                    return Ok(Err(CatalogError::Exists { name: stream.name }.into()));
                }
                let message = format!(
                    "conflict: stream {:?} exists on this node with other settings ({}) than the cluster's create \
                     at catalog entry {index} asks ({}); this node keeps its own and does not apply the create \
                     (delete the stream through the cluster and create it again to make every node alike)",
                    stream.name,
                    describe(&resolved(existing)),
                    describe(&stream),
                );
                replicated.note_conflict(message.clone());
                return Ok(Err(Failure { status: 409, message: format!("{message}\n") }));
            }
            match create_locked(state, catalog, &stream, Some(index)).await {
                Ok(spec) => {
                    tell_cluster(state, catalog);
                    Ok(Ok(serde_json::to_string_pretty(&spec).expect("a spec serializes")))
                }
                Err(ChangeError::NotSaved(failure)) => Err(failure),
                Err(ChangeError::Failed(failure)) => {
                    let message = format!(
                        "catalog entry {index}: the create of stream {:?} failed on this node: {}",
                        stream.name,
                        failure.message.trim_end()
                    );
                    replicated.note_conflict(message);
                    Ok(Err(failure))
                }
            }
        }
        Command::Delete { name, .. } => {
            if catalog.get(&name).is_none() {
                return Ok(Err(CatalogError::Unknown { name }.into()));
            }
            match delete_locked(state, catalog, &name, Some(index)).await {
                Ok(spec) => Ok(Ok(serde_json::to_string_pretty(&json!({ "deleted": spec })).expect("json serializes"))),
                Err(ChangeError::NotSaved(failure)) => Err(failure),
                Err(ChangeError::Failed(failure)) => Ok(Err(failure)),
            }
        }
    }
}

/// Whether a stream has exactly the settings a resolved create asks for.
fn same_settings(existing: &StreamSpec, stream: &NewStream) -> bool {
    existing.partitions == stream.partitions
        && Some(existing.retention_bytes) == stream.retention_bytes
        && Some(existing.retention_ms) == stream.retention_ms
        && existing.partitioner == stream.partitioner.unwrap_or_default()
        && existing.replication_factor == stream.replication_factor.unwrap_or(1)
}

/// The create that makes a stream with exactly `spec`'s settings (every one
/// given, none left to a node's defaults).
fn resolved(spec: &StreamSpec) -> NewStream {
    NewStream {
        name: spec.name.clone(),
        partitions: spec.partitions,
        retention_bytes: Some(spec.retention_bytes),
        retention_ms: Some(spec.retention_ms),
        partitioner: Some(spec.partitioner),
        replication_factor: Some(spec.replication_factor),
    }
}

fn describe(stream: &NewStream) -> String {
    format!(
        "partitions {}, retention_bytes {}, retention_ms {}, partitioner {}, replication_factor {}",
        stream.partitions,
        stream.retention_bytes.unwrap_or_default(),
        stream.retention_ms.unwrap_or_default(),
        stream.partitioner.unwrap_or_default().as_str(),
        stream.replication_factor.unwrap_or(1)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command reads back as written, and a create carries every setting.
    #[test]
    fn a_command_round_trips_through_its_log_entry() {
        let stream = NewStream {
            name: "orders".into(),
            partitions: 4,
            retention_bytes: Some(1 << 30),
            retention_ms: Some(0),
            partitioner: Some(crate::stream::Partitioner::Murmur2),
            replication_factor: Some(3),
        };
        for command in [Command::Create { request_id: 7, stream }, Command::Delete { request_id: 8, name: "x".into() }]
        {
            let bytes = serde_json::to_vec(&command).unwrap();
            assert_eq!(serde_json::from_slice::<Command>(&bytes).unwrap(), command);
        }
        assert!(serde_json::from_slice::<Command>(b"{\"op\":\"drop\"}").is_err(), "an unknown op is refused");
    }
}
