//! Streams created and deleted while the server runs, on one shard.
//!
//! The admin side ([`crate::admin`]) owns the catalog and runs each change
//! in rounds over every shard (see [`StreamChange`]), so no batch ever
//! reaches an owner that has not installed its partition, and none routed
//! after a delete is stored: ingest checks its stream after every await
//! (once per chunk), and an owner discards the records of a deleted
//! stream's partitions that were already in flight (counted).
//!
//! A delete here: `Deactivate` stops this shard routing to the stream,
//! tells the stream's subscribers and group members on this shard at once
//! (`ERR stream_deleted`), forgets its groups, and starts a *fence*: the
//! shard's own open batches to every owner are sent and applied, after which
//! nothing this shard routed to the stream is in flight any more. `Settle`
//! then waits until none of the stream's partitions moves into or out of
//! this shard, and `Drop` waits for that again and takes them out between
//! commit rounds and closes their files (the admin side deletes them). Once
//! every shard's fence is done the stream's partition ids can go to a new
//! stream.
//!
//! Why two waits: no move of an inactive stream's partition starts, but one
//! started before the deactivation goes on, and at first only its old owner
//! knows it (the thief learns from a placement frame still on the mesh). A
//! thief that dropped the stream then would later install the partition
//! handed to it, and a new stream given those ids would find it there
//! ("installed twice"; seen in CI, 2026-12-07). Once every shard has
//! settled, each old owner has sent its handoff, so each thief had the
//! placement before that (its marker, sent on the placement, is what the
//! handoff waited for): at `Drop` a thief still waiting for a partition
//! knows it, and takes it out once it arrived.

use std::rc::Rc;
use std::time::Duration;

use crate::runtime::log;
use crate::shard::Shard;
use crate::shard::control::StreamChange;
use crate::storage::segment::SegmentError;
use crate::stream::StreamSpec;

/// How often a drop re-checks that no partition of the stream is migrating.
const DROP_RETRY_MS: u64 = 10;

/// Why a shard could not install a new stream.
#[derive(Debug)]
pub enum InstallError {
    /// Creating or opening the files of a partition this shard owns failed.
    Storage { stream: String, error: SegmentError },
}

impl InstallError {
    /// The HTTP status `POST /streams` answers with (the create is undone):
    /// `507` when the disk is full (free space, then create it again), `500`
    /// for any other storage failure.
    pub fn http_status(&self) -> u16 {
        match self {
            InstallError::Storage { error, .. } if error.is_storage_full() => 507,
            InstallError::Storage { .. } => 500,
        }
    }
}

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstallError::Storage { stream, error } if error.is_storage_full() => write!(
                f,
                "storage_full: installing stream {stream}: {error} (free space on the data directory's disk, then \
                 create it again)"
            ),
            InstallError::Storage { stream, error } => write!(f, "storage_error: installing stream {stream}: {error}"),
        }
    }
}

impl std::error::Error for InstallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InstallError::Storage { error, .. } => Some(error),
        }
    }
}

/// Handles one stream request; those that wait run as their own task.
pub fn handle(shard: &Rc<Shard>, request: StreamChange) {
    match request {
        StreamChange::Install { spec, reply } => {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                let _ = reply.send(install(&shard, spec).await);
            })
            .detach();
        }
        StreamChange::Activate { id, reply } => {
            shard.streams.borrow_mut().activate(id);
            let _ = reply.send(());
        }
        StreamChange::Deactivate { id, reply, fenced } => {
            deactivate(shard, id);
            let _ = reply.send(());
            let shard = shard.clone();
            glommio::spawn_local(async move {
                // Everything this shard routed before the deactivation is
                // applied (or discarded) at its owner once this returns.
                shard.ingress.sync_barrier(0..shard.shard_count).await;
                let _ = fenced.send(());
            })
            .detach();
        }
        StreamChange::Settle { id, reply } => {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                let globals: Vec<u32> =
                    shard.streams.borrow().catalog().by_id(id).map(|spec| spec.globals().collect()).unwrap_or_default();
                until_none_moves(&shard, &globals).await;
                let _ = reply.send(());
            })
            .detach();
        }
        StreamChange::Drop { id, reply } => {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                drop_stream(&shard, id).await;
                let _ = reply.send(());
            })
            .detach();
        }
    }
}

/// Adds the stream (inactive) and opens the partitions this shard owns. Its
/// ids may be a deleted stream's, free again: they are no longer retired.
async fn install(shard: &Rc<Shard>, spec: StreamSpec) -> Result<(), InstallError> {
    {
        let mut partitions = shard.partitions.borrow_mut();
        spec.globals().for_each(|global| partitions.unretire(global));
    }
    shard.streams.borrow_mut().install(spec.clone());
    shard.replication.refresh(shard.streams.borrow().catalog(), shard.config.partitions_max);
    match shard.open_stream_partitions(&spec).await {
        Ok(_) => Ok(()),
        Err(error) => Err(InstallError::Storage { stream: spec.name, error }),
    }
}

/// Stops routing to the stream, ends its subscriptions and group members
/// on this shard, and forgets the groups this shard coordinates for it.
fn deactivate(shard: &Rc<Shard>, id: u32) {
    let base = {
        let mut streams = shard.streams.borrow_mut();
        streams.deactivate(id);
        streams.catalog().by_id(id).map(|spec| spec.base)
    };
    if let Some(base) = base {
        shard.subscriptions.tell_deleted(shard.id, id, base);
    }
    shard.forget_stream_groups(id);
}

/// Removes the partitions of a deactivated stream from this shard, once no
/// migration of them is in flight (the balancer moves no partition of an
/// inactive stream, so none starts): they leave between commit rounds and
/// are retired in the same step, so a record still in flight for them is
/// discarded from then on. Their files are closed, not deleted: the admin
/// side moves the stream's directory away once every shard is done.
async fn drop_stream(shard: &Rc<Shard>, id: u32) {
    let Some(spec) = shard.streams.borrow().catalog().by_id(id).cloned() else { return };
    let globals: Vec<u32> = spec.globals().collect();
    until_none_moves(shard, &globals).await;
    let detached = shard.detach_partitions(&globals, true).await;
    shard.aggregates.forget_partitions(&globals);
    for (partition_id, partition) in detached {
        let Some(mut partition) = partition else { continue };
        let Some(writer) = partition.log.parts_mut().1.and_then(|disk| disk.take_writer()) else { continue };
        if let Err(error) = writer.close().await {
            log::warn!(
                shard = shard.id,
                stream = &spec.name,
                "closing partition {partition_id} of the deleted stream: {error}"
            );
        }
    }
    shard.streams.borrow_mut().remove(id);
    shard.replication.refresh(shard.streams.borrow().catalog(), shard.config.partitions_max);
    // Parked fetches of its partitions learn it is gone.
    shard.subscriptions.wake_parked();
}

/// Resolves once none of `partitions` moves into or out of this shard.
async fn until_none_moves(shard: &Shard, partitions: &[u32]) {
    while partitions.iter().any(|&global| shard.migrations.borrow().is_moving(global)) {
        glommio::timer::sleep(Duration::from_millis(DROP_RETRY_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io_failure(errno: i32) -> SegmentError {
        let source = std::io::Error::from_raw_os_error(errno);
        SegmentError::Io { op: "create segment", path: "/data/streams/s/0/x.log".into(), position: 0, source }
    }

    /// A full disk answers `507 storage_full` with what to do; any other
    /// storage failure `500 storage_error`; both name the stream and the
    /// file.
    #[test]
    fn install_errors_map_to_http_statuses() {
        let full = InstallError::Storage { stream: "clicks".into(), error: io_failure(libc::ENOSPC) };
        assert_eq!(full.http_status(), 507);
        let text = full.to_string();
        assert!(text.starts_with("storage_full: installing stream clicks: create segment /data/"), "{text}");
        assert!(text.contains("free space"), "{text}");
        let denied = InstallError::Storage { stream: "clicks".into(), error: io_failure(libc::EACCES) };
        assert_eq!(denied.http_status(), 500);
        assert!(denied.to_string().starts_with("storage_error: installing stream clicks"), "{denied}");
        let dir = crate::storage::dir::DirError::Io {
            op: "list",
            path: "/data/streams/clicks/0".into(),
            source: std::io::Error::from_raw_os_error(libc::EDQUOT),
        };
        let quota = InstallError::Storage { stream: "clicks".into(), error: dir.into() };
        assert_eq!(quota.http_status(), 507, "a directory error keeps its errno: {quota}");
    }
}
