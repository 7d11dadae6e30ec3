//! Committed offsets on disk: one small JSON file per group,
//! `<data-dir>/groups/<stream>/<group>.json`, replaced atomically (written
//! to a temporary file, fsynced, renamed, the directory fsynced) by the
//! group's coordinator after commits, off the shard's thread
//! ([`write_files`] runs in glommio's blocking pool). A commit is
//! acknowledged only after the file that holds it is durable.
//!
//! The file names the stream's id: a stream deleted and created again with
//! the same name does not inherit the old groups' offsets.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What one group's file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredGroup {
    pub stream: String,
    pub stream_id: u32,
    pub group: String,
    pub hold: bool,
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

/// Writes each file atomically and durably. Runs on a blocking thread.
pub fn write_files(files: &[(PathBuf, Vec<u8>)]) -> Result<(), String> {
    for (path, bytes) in files {
        write_file(path, bytes).map_err(|error| format!("{}: {error}", path.display()))?;
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().expect("a group file is in its stream's directory");
    std::fs::create_dir_all(dir)?;
    let temporary = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Reads every group file under the data directory. A file that does not
/// parse is reported and skipped (the group starts without offsets).
pub fn load_all(data_dir: &Path) -> (Vec<StoredGroup>, Vec<String>) {
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
            match std::fs::read(&path)
                .map_err(|error| error.to_string())
                .and_then(|bytes| serde_json::from_slice::<StoredGroup>(&bytes).map_err(|error| error.to_string()))
            {
                Ok(group) => groups.push(group),
                Err(error) => problems.push(format!("{}: {error}", path.display())),
            }
        }
    }
    (groups, problems)
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
            offsets: vec![(0, 10), (5, 99)],
        };
        let path = group_path(&dir, "clicks", "billing");
        write_files(&[(path.clone(), serde_json::to_vec(&group).unwrap())]).unwrap();
        std::fs::write(groups_dir(&dir).join("clicks").join("broken.json"), b"{").unwrap();
        let (loaded, problems) = load_all(&dir);
        assert_eq!(loaded, vec![group]);
        assert_eq!(problems.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
