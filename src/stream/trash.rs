//! Where deleted streams' files go: `<data-dir>/trash/`.
//!
//! A delete renames a stream's directories (`streams/<name>`, and its
//! consumer groups' `groups/<name>`) into the trash and fsyncs the
//! directories involved, so once the catalog no longer names the stream no
//! crash can bring its files back where a new stream of the same name would
//! open them. Removing the trash's contents can take long for a large
//! stream and needs no durability: it runs off the shards and the admin
//! thread, and a start removes whatever an earlier run left there.

use std::path::{Path, PathBuf};

use crate::runtime::log;
use crate::stream::{CatalogError, StreamSpec, TRASH_DIR_NAME};

/// The trash directory of a data directory.
pub fn trash_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(TRASH_DIR_NAME)
}

/// The directories a stream's data lives in: its partitions', its groups'.
fn stream_dirs(data_dir: &Path, name: &str) -> [PathBuf; 2] {
    [data_dir.join("streams").join(name), crate::group::store::groups_dir(data_dir).join(name)]
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CatalogError + 'a {
    move |error| CatalogError::Io { op, path: path.to_path_buf(), error }
}

/// Renames `from` into the trash as `entry` (replacing an entry of that
/// name, left by an interrupted earlier attempt), durably: both parent
/// directories are fsynced. A missing `from` is nothing to do.
fn move_into_trash(data_dir: &Path, from: &Path, entry: &str) -> Result<(), CatalogError> {
    if !from.exists() {
        return Ok(());
    }
    let trash = trash_dir(data_dir);
    std::fs::create_dir_all(&trash).map_err(io("create", &trash))?;
    let to = trash.join(entry);
    if to.exists() {
        std::fs::remove_dir_all(&to).map_err(io("remove", &to))?;
    }
    std::fs::rename(from, &to).map_err(io("rename into the trash", from))?;
    let parent = from.parent().unwrap_or(data_dir);
    for dir in [parent, trash.as_path(), data_dir] {
        std::fs::File::open(dir).and_then(|file| file.sync_all()).map_err(io("fsync", dir))?;
    }
    Ok(())
}

/// Moves a deleted stream's directories into the trash (see the module doc).
pub fn move_stream_to_trash(data_dir: &Path, spec: &StreamSpec) -> Result<(), CatalogError> {
    let [partitions, groups] = stream_dirs(data_dir, &spec.name);
    move_into_trash(data_dir, &partitions, &format!("stream-{}", spec.id))?;
    move_into_trash(data_dir, &groups, &format!("groups-{}", spec.id))
}

/// Moves into the trash every stream or group directory that none of
/// `live` (the catalog's stream names) owns: files an older release left
/// behind a delete it did not finish. Returns what it moved.
pub fn move_orphans_to_trash(data_dir: &Path, live: &[&str]) -> Result<Vec<PathBuf>, CatalogError> {
    let mut moved = Vec::new();
    let parents = [data_dir.join("streams"), crate::group::store::groups_dir(data_dir)];
    for (kind, parent) in ["stream", "groups"].iter().zip(&parents) {
        let Ok(entries) = std::fs::read_dir(parent) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let owned = name.to_str().is_some_and(|name| live.contains(&name));
            if owned || !entry.path().is_dir() {
                continue;
            }
            let unique = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let trash_entry = format!("orphan-{kind}-{}-{}", name.to_string_lossy(), unique.as_nanos());
            move_into_trash(data_dir, &entry.path(), &trash_entry)?;
            moved.push(entry.path());
        }
    }
    Ok(moved)
}

/// Removes everything in the trash. Slow for a large stream: run it on a
/// thread of its own.
pub fn empty_trash(data_dir: &Path) {
    let trash = trash_dir(data_dir);
    let Ok(entries) = std::fs::read_dir(&trash) else { return };
    for entry in entries.flatten() {
        if let Err(error) = std::fs::remove_dir_all(entry.path()) {
            log::warn!("could not remove {} from the trash: {error}", entry.path().display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deleted stream's directories leave their places for the trash,
    /// a second attempt (after a crash) is harmless, and emptying the trash
    /// removes them; directories no stream owns go too, live ones stay.
    #[test]
    fn deleted_and_orphaned_directories_go_to_the_trash() {
        let data = std::env::temp_dir().join(format!("spate-trash-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        for dir in ["streams/gone/0", "groups/gone", "streams/live/0", "streams/orphan/3"] {
            std::fs::create_dir_all(data.join(dir)).unwrap();
        }
        let spec = StreamSpec {
            id: 7,
            name: "gone".into(),
            partitions: 1,
            base: 0,
            retention_bytes: 1,
            retention_ms: 0,
            partitioner: Default::default(),
            replication_factor: 1,
        };
        move_stream_to_trash(&data, &spec).unwrap();
        move_stream_to_trash(&data, &spec).unwrap();
        assert!(!data.join("streams/gone").exists() && !data.join("groups/gone").exists());
        assert!(trash_dir(&data).join("stream-7").join("0").is_dir());
        let moved = move_orphans_to_trash(&data, &["live"]).unwrap();
        assert_eq!(moved, vec![data.join("streams").join("orphan")]);
        assert!(data.join("streams/live/0").is_dir());
        empty_trash(&data);
        assert_eq!(std::fs::read_dir(trash_dir(&data)).unwrap().count(), 0);
        std::fs::remove_dir_all(&data).unwrap();
    }
}
