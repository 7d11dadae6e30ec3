//! Committed offsets on disk: one small JSON file per group,
//! `<data-dir>/groups/<stream>/<group>.json`, replaced atomically and
//! durably ([`crate::storage::durable::replace_durably`]) by the
//! group's coordinator after commits, off the shard's thread
//! ([`write_files`] runs in glommio's blocking pool). A commit is
//! acknowledged only after the file that holds it is durable.
//!
//! The file names the stream's id: a stream deleted and created again with
//! the same name does not inherit the old groups' offsets.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::storage::durable::{ReplaceError, replace_durably};

/// What one group's file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredGroup {
    pub stream: String,
    pub stream_id: u32,
    pub group: String,
    pub hold: bool,
    /// A Kafka consumer group's offsets (absent in files written before
    /// Kafka groups: false).
    #[serde(default)]
    pub kafka: bool,
    /// `(partition, next offset)` for every partition the group committed.
    pub offsets: Vec<(u32, u64)>,
}

/// The directory of every group's file.
pub fn groups_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("groups")
}

/// One group's file (names are checked `[a-z0-9._-]`, never `.` or `..`).
pub fn group_path(data_dir: &Path, stream: &str, group: &str) -> PathBuf {
    groups_dir(data_dir).join(stream).join(format!("{group}.json"))
}

/// Why a group's file could not be written or read.
#[derive(Debug)]
pub enum StoreError {
    /// The stream's directory of group files could not be created.
    CreateDir { path: PathBuf, source: std::io::Error },
    /// A group's file could not be replaced (the commits it holds are
    /// acknowledged only once a retry succeeds).
    Write(ReplaceError),
    /// A group's file could not be read at start.
    Read { path: PathBuf, source: std::io::Error },
    /// A group's file is not a group's offsets (the group starts without).
    Parse { path: PathBuf, error: serde_json::Error },
}

impl StoreError {
    /// Whether the disk (or the quota) is full: space coming back fixes it.
    pub fn is_storage_full(&self) -> bool {
        match self {
            StoreError::CreateDir { source, .. } => {
                matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
            }
            StoreError::Write(error) => error.is_storage_full(),
            StoreError::Read { .. } | StoreError::Parse { .. } => false,
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::CreateDir { path, source } => write!(f, "create directory {}: {source}", path.display()),
            StoreError::Write(error) => write!(f, "{error}"),
            StoreError::Read { path, source } => write!(f, "read {}: {source}", path.display()),
            StoreError::Parse { path, error } => {
                write!(f, "{}: {error} (not a consumer group's offsets file: move it away)", path.display())
            }
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::CreateDir { source, .. } | StoreError::Read { source, .. } => Some(source),
            StoreError::Write(error) => Some(error),
            StoreError::Parse { error, .. } => Some(error),
        }
    }
}

/// Writes each file atomically and durably ([`replace_durably`]), creating
/// its stream's directory if needed. Runs on a blocking thread.
pub fn write_files(files: &[(PathBuf, Vec<u8>)]) -> Result<(), StoreError> {
    for (path, bytes) in files {
        let dir = crate::storage::segment::parent_dir(path);
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir { path: dir.to_path_buf(), source })?;
        replace_durably(path, bytes).map_err(StoreError::Write)?;
    }
    Ok(())
}

/// Reads every group file under the data directory. A file that does not
/// read or parse is reported and skipped (the group starts without
/// offsets).
pub fn load_all(data_dir: &Path) -> (Vec<StoredGroup>, Vec<StoreError>) {
    let mut groups = Vec::new();
    let mut problems = Vec::new();
    let Ok(streams) = std::fs::read_dir(groups_dir(data_dir)) else { return (groups, problems) };
    for stream in streams.flatten() {
        let Ok(files) = std::fs::read_dir(stream.path()) else { continue };
        for file in files.flatten() {
            let path = file.path();
            if path.extension().is_none_or(|extension| extension != "json") {
                continue;
            }
            match load_one(path) {
                Ok(group) => groups.push(group),
                Err(problem) => problems.push(problem),
            }
        }
    }
    (groups, problems)
}

fn load_one(path: PathBuf) -> Result<StoredGroup, StoreError> {
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(source) => return Err(StoreError::Read { path, source }),
    };
    serde_json::from_slice(&bytes).map_err(|error| StoreError::Parse { path, error })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip() {
        let dir = std::env::temp_dir().join(format!("spate-group-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let group = StoredGroup {
            stream: "clicks".into(),
            stream_id: 3,
            group: "billing".into(),
            hold: true,
            kafka: false,
            offsets: vec![(0, 10), (5, 99)],
        };
        let path = group_path(&dir, "clicks", "billing");
        write_files(&[(path.clone(), serde_json::to_vec(&group).unwrap())]).unwrap();
        std::fs::write(groups_dir(&dir).join("clicks").join("broken.json"), b"{").unwrap();
        let (loaded, problems) = load_all(&dir);
        assert_eq!(loaded, vec![group]);
        assert_eq!(problems.len(), 1);
        assert!(matches!(problems[0], StoreError::Parse { .. }), "{}", problems[0]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
