//! Replacing a small file atomically and durably: [`replace_durably`].
//!
//! The stream catalog (`streams.json`), a consumer group's committed
//! offsets (`groups/<stream>/<group>.json`) and a partition's aggregate
//! checkpoint (`aggregates.ckpt`) are whole files rewritten at once. Each
//! is written to a temporary file next to it, fsynced, renamed over the
//! old one and the directory fsynced, so that after a crash at any moment
//! the path holds either the old bytes or the new ones, never a mix, and a
//! replacement that returned `Ok` survives a power cut.
//!
//! This is blocking `std::fs`: it runs on the admin thread, at start-up or
//! in glommio's blocking pool, never on a shard's executor. (A segment's
//! index sidecar does the same dance through glommio's DMA files on the
//! shard itself: [`crate::storage::segment::write_index_file`].)
//!
//! The temporary file is `<name>.<n>.tmp`, `n` counting the replacements of
//! this process, so two writers of one path (the old and the new owner of
//! a partition checkpointing it during a move) never share one. A crash can
//! leave one behind; the next run reuses its name (its counter starts
//! again), and nothing reads `*.tmp`. A replacement that fails removes its
//! temporary file and leaves the old file as it was.

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Replacements started by this process: the temporary files' numbers.
static REPLACEMENTS: AtomicU64 = AtomicU64::new(0);

/// A replacement that failed: which step, on which path. The old file, if
/// any, is unchanged unless the step is the directory's fsync (the rename
/// happened; whether it survives a power cut is unknown).
#[derive(Debug)]
pub struct ReplaceError {
    /// `create`, `write`, `fsync`, `rename`, `open directory` or
    /// `fsync directory`.
    pub op: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl ReplaceError {
    /// Whether the disk (or the quota) is full: space coming back fixes it.
    pub fn is_storage_full(&self) -> bool {
        matches!(self.source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
    }
}

impl fmt::Display for ReplaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl std::error::Error for ReplaceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Makes `path` hold `bytes`, atomically and durably: a temporary file in
/// the same directory, fsynced, renamed over `path`, the directory fsynced.
/// The directory must exist. On failure no temporary file is left.
pub fn replace_durably(path: &Path, bytes: &[u8]) -> Result<(), ReplaceError> {
    let temporary = temporary_path(path);
    let replaced = replace_through(&temporary, path, bytes);
    if replaced.is_err() {
        // Gone already when the rename happened; any other failure to
        // remove it would have failed the step before too.
        let _ = std::fs::remove_file(&temporary);
    }
    replaced
}

/// `<dir>/<name>.<n>.tmp` for `path` = `<dir>/<name>`.
fn temporary_path(path: &Path) -> PathBuf {
    let serial = REPLACEMENTS.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or(path.as_os_str()).to_owned();
    name.push(format!(".{serial}.tmp"));
    path.with_file_name(name)
}

fn replace_through(temporary: &Path, path: &Path, bytes: &[u8]) -> Result<(), ReplaceError> {
    let failed = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| ReplaceError { op, path, source }
    };
    let mut file = File::create(temporary).map_err(failed("create", temporary))?;
    file.write_all(bytes).map_err(failed("write", temporary))?;
    file.sync_all().map_err(failed("fsync", temporary))?;
    drop(file);
    std::fs::rename(temporary, path).map_err(failed("rename", path))?;
    let dir = crate::storage::segment::parent_dir(path);
    let dir_file = File::open(dir).map_err(failed("open directory", dir))?;
    dir_file.sync_all().map_err(failed("fsync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spate-durable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|entry| entry.unwrap().file_name().to_string_lossy().into()).collect();
        names.sort();
        names
    }

    /// A replacement creates the file, then replaces its bytes whole, and
    /// leaves nothing else in the directory.
    #[test]
    fn replaces_and_leaves_only_the_file() {
        let dir = scratch_dir("replace");
        let path = dir.join("streams.json");
        replace_durably(&path, b"first, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first, longer");
        replace_durably(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(names_in(&dir), ["streams.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Into a directory that does not exist: an error naming the step and
    /// the path, and no file anywhere.
    #[test]
    fn a_missing_directory_fails_with_op_and_path() {
        let dir = scratch_dir("missing");
        let path = dir.join("gone").join("offsets.json");
        let error = replace_durably(&path, b"x").unwrap_err();
        assert_eq!(error.op, "create");
        assert!(error.path.starts_with(dir.join("gone")), "{error}");
        assert_eq!(error.source.kind(), io::ErrorKind::NotFound);
        assert!(!error.is_storage_full());
        assert!(error.to_string().starts_with(&format!("create {}", dir.join("gone").display())), "{error}");
        assert_eq!(names_in(&dir), Vec::<String>::new());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A rename that fails (the target is a non-empty directory) leaves the
    /// target as it was and removes the temporary file it had written and
    /// synced.
    #[test]
    fn a_failed_rename_leaves_no_temporary_file() {
        let dir = scratch_dir("rename");
        let path = dir.join("aggregates.ckpt");
        std::fs::create_dir_all(path.join("inside")).unwrap();
        let error = replace_durably(&path, b"checkpoint").unwrap_err();
        assert_eq!(error.op, "rename", "{error}");
        assert_eq!(error.path, path);
        assert_eq!(names_in(&dir), ["aggregates.ckpt"]);
        assert!(path.join("inside").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// On a full filesystem the write fails as storage full, the old file
    /// keeps its bytes and no temporary file is left. Needs root to mount a
    /// small tmpfs; skipped otherwise.
    #[test]
    fn a_full_disk_keeps_the_old_file_and_leaves_no_temporary_file() {
        let dir = scratch_dir("full");
        if !crate::storage::mount_tmpfs(&dir, "64k") {
            return;
        }
        let path = dir.join("offsets.json");
        replace_durably(&path, b"old").unwrap();
        let mut filler = File::create(dir.join("filler")).unwrap();
        while filler.write_all(&[1u8; 4096]).is_ok() {}
        drop(filler);
        let error = replace_durably(&path, &[7u8; 16 << 10]).unwrap_err();
        let (names, kept) = (names_in(&dir), std::fs::read(&path).unwrap());
        let unmounted = std::process::Command::new("umount").arg(&dir).status();
        assert!(error.is_storage_full(), "{error}");
        assert_eq!(error.op, "write", "{error}");
        assert_eq!(names, ["filler", "offsets.json"], "no temporary file");
        assert_eq!(kept, b"old");
        assert!(unmounted.is_ok_and(|status| status.success()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Temporary names differ between replacements of one path, so two
    /// writers never write into one temporary file.
    #[test]
    fn temporary_names_are_unique() {
        let path = Path::new("/data/streams/s/0/aggregates.ckpt");
        let (first, second) = (temporary_path(path), temporary_path(path));
        assert_ne!(first, second);
        assert_eq!(first.parent(), path.parent());
        let name = first.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("aggregates.ckpt.") && name.ends_with(".tmp"), "{name}");
    }
}
