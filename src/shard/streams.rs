//! Streams created and deleted while the server runs, on one shard.
//!
//! The admin side ([`crate::admin`]) owns the catalog and runs each change
//! in two rounds over every shard (see [`StreamRequest`]), so no batch ever
//! reaches an owner that has not installed its partition, and none routed
//! after a delete is stored: ingest checks its stream once per chunk, and an
//! owner discards the records of a deleted stream's partitions that were
//! already in flight (counted).

use std::rc::Rc;
use std::time::Duration;

use crate::shard::Shard;
use crate::shard::control::StreamRequest;
use crate::stream::StreamSpec;

/// How often a drop re-checks that no partition of the stream is migrating.
const DROP_RETRY_MS: u64 = 10;

/// Handles one stream request; those that wait run as their own task.
pub fn handle(shard: &Rc<Shard>, request: StreamRequest) {
    match request {
        StreamRequest::Install { spec, reply } => {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                let _ = reply.send(install(&shard, spec).await);
            })
            .detach();
        }
        StreamRequest::Activate { id, reply } => {
            shard.streams.borrow_mut().activate(id);
            let _ = reply.send(());
        }
        StreamRequest::Deactivate { id, reply } => {
            shard.streams.borrow_mut().deactivate(id);
            let _ = reply.send(());
        }
        StreamRequest::Drop { id, reply } => {
            shard.forget_stream_groups(id);
            let shard = shard.clone();
            glommio::spawn_local(async move {
                let _ = reply.send(drop_stream(&shard, id).await);
            })
            .detach();
        }
    }
}

/// Adds the stream (inactive) and opens the partitions this shard owns.
async fn install(shard: &Rc<Shard>, spec: StreamSpec) -> Result<(), String> {
    shard.streams.borrow_mut().install(spec.clone());
    shard.open_stream_partitions(&spec).await.map(drop).map_err(|error| error.to_string())
}

/// Removes the partitions of a deactivated stream from this shard and
/// deletes their files: after any migration of them ends (the balancer
/// moves no partition of an inactive stream, so none starts), and after a
/// commit round (nothing of theirs is left in flight to the disk).
async fn drop_stream(shard: &Rc<Shard>, id: u32) -> Result<(), String> {
    let Some(spec) = shard.streams.borrow().catalog().by_id(id).cloned() else { return Ok(()) };
    let globals: Vec<u32> = (0..spec.partitions).map(|local| spec.global(local)).collect();
    while globals.iter().any(|&global| migrating(shard, global)) {
        glommio::timer::sleep(Duration::from_millis(DROP_RETRY_MS)).await;
    }
    if let Some(committer) = &shard.committer {
        committer.barrier().await;
    }
    let mut dirs = Vec::new();
    for &global in &globals {
        let removed = shard.partitions.borrow_mut().remove(global);
        shard.partitions.borrow_mut().retire(global);
        let Some(mut partition) = removed else { continue };
        let disk = partition.log.parts_mut().1.map(|disk| (disk.dir().to_path_buf(), disk.take_writer()));
        if let Some((dir, writer)) = disk {
            if let Some(writer) = writer {
                let _ = writer.close().await;
            }
            dirs.push(dir);
        }
    }
    shard.streams.borrow_mut().remove(id);
    for dir in dirs {
        std::fs::remove_dir_all(&dir).map_err(|error| format!("delete {}: {error}", dir.display()))?;
    }
    Ok(())
}

/// Whether `global` is moving into or out of this shard.
fn migrating(shard: &Shard, global: u32) -> bool {
    shard.migrations.borrow().is_moving(global)
}
