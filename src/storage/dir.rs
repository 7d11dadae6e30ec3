//! Where the log lives on disk: the data directory, its lock, and the names
//! of segment files.
//!
//! ```text
//! <data-dir>/spate.lock                                   flock'ed by the running server, holds its pid
//! <data-dir>/streams/<stream>/<partition>/<base:020>.log    a segment: frames from offset <base>
//! <data-dir>/streams/<stream>/<partition>/<base:020>.index  its sparse index, once sealed
//! ```
//!
//! Base offsets are zero-padded to 20 digits (`u64::MAX` has 20), so names
//! sort as their offsets do. These functions use blocking `std::fs`: they
//! run at start-up and on segment roll, never per event.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::runtime::log;

/// Name of the lock file in the data directory.
pub const LOCK_FILE_NAME: &str = "spate.lock";
/// Extension of a segment file.
pub const SEGMENT_EXTENSION: &str = "log";
/// Extension of a segment's index sidecar.
pub const INDEX_EXTENSION: &str = "index";
pub use crate::config::limits::STREAM_NAME_SIZE_MAX;
/// Digits of a base offset in a file name.
const BASE_OFFSET_DIGITS: usize = 20;

/// A data-directory operation that failed.
#[derive(Debug)]
pub enum DirError {
    /// Another process holds the data directory's lock.
    Locked {
        lock_path: PathBuf,
        holder_pid: Option<u32>,
    },
    /// A stream name that is not 1 to 64 of `[A-Za-z0-9_.-]` (or is `.`/`..`).
    BadStreamName {
        stream: String,
    },
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for DirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirError::Locked { lock_path, holder_pid: Some(pid) } => {
                write!(f, "data directory is in use: {} is locked by pid {pid}", lock_path.display())
            }
            DirError::Locked { lock_path, holder_pid: None } => {
                write!(f, "data directory is in use: {} is locked by another process", lock_path.display())
            }
            DirError::BadStreamName { stream } => write!(
                f,
                "stream name {stream:?} is not 1 to {STREAM_NAME_SIZE_MAX} of [A-Za-z0-9_.-] (and not . or ..)"
            ),
            DirError::Io { op, path, source } => write!(f, "{op} {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for DirError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DirError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DirError + 'a {
    move |source| DirError::Io { op, path: path.to_path_buf(), source }
}

/// The exclusive lock on a data directory; released when dropped (or when
/// the process dies: flock locks belong to the open file).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    pub fn lock_path(&self) -> &Path {
        &self.path
    }
}

/// Creates `data_dir` if missing and takes an exclusive, non-blocking
/// `flock` on its lock file, writing this process's pid into it. Fails with
/// [`DirError::Locked`], naming the holder's pid, when another process (or
/// another open of the file in this one) holds it.
///
/// The pid is written over the old one in place, then the file cut to it,
/// so a full disk does not stop a restart (the old pid's block is reused;
/// truncating first would free it only at the journal's next commit on
/// ext4). Where even that fails for lack of space the lock still holds:
/// the pid only names the holder in the error a second server gets.
pub fn lock_data_dir(data_dir: &Path) -> Result<DataDirLock, DirError> {
    fs::create_dir_all(data_dir).map_err(io_error("create data directory", data_dir))?;
    let path = data_dir.join(LOCK_FILE_NAME);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_error("open lock file", &path))?;
    // SAFETY: flock on a file descriptor this function owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut text = String::new();
            let holder_pid = file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
            return Err(DirError::Locked { lock_path: path, holder_pid });
        }
        return Err(DirError::Io { op: "flock", path, source: error });
    }
    let pid_line = format!("{}\n", std::process::id());
    let written = file
        .rewind()
        .and_then(|()| file.write_all(pid_line.as_bytes()))
        .and_then(|()| file.set_len(pid_line.len() as u64))
        .and_then(|()| file.sync_data());
    match written {
        Ok(()) => {}
        Err(error) if matches!(error.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) => {
            log::warn!("could not write the pid to {}: {error} (the lock holds)", path.display());
        }
        Err(error) => return Err(DirError::Io { op: "write pid to lock file", path, source: error }),
    }
    Ok(DataDirLock { _file: file, path })
}

/// Checks that `stream` is safe as one path component.
pub fn check_stream_name(stream: &str) -> Result<(), DirError> {
    let allowed = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-');
    let ok = !stream.is_empty()
        && stream.len() <= STREAM_NAME_SIZE_MAX
        && stream != "."
        && stream != ".."
        && stream.bytes().all(allowed);
    if ok { Ok(()) } else { Err(DirError::BadStreamName { stream: stream.to_string() }) }
}

/// The directory of one stream's partitions.
pub fn stream_dir(data_dir: &Path, stream: &str) -> Result<PathBuf, DirError> {
    check_stream_name(stream)?;
    Ok(data_dir.join("streams").join(stream))
}

/// The directory of one partition's segments.
pub fn partition_dir(data_dir: &Path, stream: &str, partition: u32) -> Result<PathBuf, DirError> {
    Ok(stream_dir(data_dir, stream)?.join(partition.to_string()))
}

/// The segment file whose first offset is `base_offset`.
pub fn segment_path(partition_dir: &Path, base_offset: u64) -> PathBuf {
    partition_dir.join(format!("{base_offset:0BASE_OFFSET_DIGITS$}.{SEGMENT_EXTENSION}"))
}

/// The index sidecar of the segment whose first offset is `base_offset`.
pub fn index_path(partition_dir: &Path, base_offset: u64) -> PathBuf {
    partition_dir.join(format!("{base_offset:0BASE_OFFSET_DIGITS$}.{INDEX_EXTENSION}"))
}

/// The base offset named by a segment file name (`<20 digits>.log`), or
/// `None` for any other name.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_EXTENSION)?.strip_suffix('.')?;
    if digits.len() != BASE_OFFSET_DIGITS || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One segment found in a partition directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentFiles {
    pub base_offset: u64,
    pub log_path: PathBuf,
    /// The sidecar, when one exists (it may still be damaged).
    pub index_path: Option<PathBuf>,
}

/// The segments of a partition directory, by base offset. Other files
/// (temporary index files, the lock) are ignored; a missing directory is a
/// partition with no segments.
pub fn list_segments(partition_dir: &Path) -> Result<Vec<SegmentFiles>, DirError> {
    let entries = match fs::read_dir(partition_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(DirError::Io { op: "list", path: partition_dir.to_path_buf(), source: error }),
    };
    let mut segments = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error("list", partition_dir))?;
        let name = entry.file_name();
        let Some(base_offset) = name.to_str().and_then(parse_segment_file_name) else { continue };
        let index = index_path(partition_dir, base_offset);
        let index_path = index.exists().then_some(index);
        segments.push(SegmentFiles { base_offset, log_path: entry.path(), index_path });
    }
    segments.sort_by_key(|segment| segment.base_offset);
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spate-dir-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// Paths follow the documented layout and file names parse back.
    #[test]
    fn names_round_trip() {
        let dir = partition_dir(Path::new("/data"), "clicks", 7).unwrap();
        assert_eq!(dir, Path::new("/data/streams/clicks/7"));
        assert_eq!(segment_path(&dir, 42), Path::new("/data/streams/clicks/7/00000000000000000042.log"));
        assert_eq!(index_path(&dir, 42), Path::new("/data/streams/clicks/7/00000000000000000042.index"));
        assert_eq!(parse_segment_file_name("18446744073709551615.log"), Some(u64::MAX));
        for bad in ["42.log", "0000000000000000004x.log", "00000000000000000042.index", "00000000000000000042.log.tmp"]
        {
            assert_eq!(parse_segment_file_name(bad), None, "{bad}");
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(partition_dir(Path::new("/data"), bad, 0).is_err(), "{bad:?}");
        }
    }

    /// Listing returns segments by offset with their sidecars, skips other
    /// files, and treats a missing directory as empty.
    #[test]
    fn list_segments_sorts_and_filters() {
        let dir = scratch_dir("list");
        assert_eq!(list_segments(&dir).unwrap(), Vec::new());
        fs::create_dir_all(&dir).unwrap();
        for base in [300u64, 0, 20] {
            fs::write(segment_path(&dir, base), b"").unwrap();
        }
        fs::write(index_path(&dir, 20), b"").unwrap();
        fs::write(dir.join("00000000000000000020.index.tmp"), b"").unwrap();
        let segments = list_segments(&dir).unwrap();
        let bases: Vec<u64> = segments.iter().map(|segment| segment.base_offset).collect();
        assert_eq!(bases, [0, 20, 300]);
        assert_eq!(segments[1].index_path, Some(index_path(&dir, 20)));
        assert_eq!(segments[0].index_path, None);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A second lock on the same data directory fails and names the pid of
    /// the holder; dropping the lock releases it.
    #[test]
    fn data_dir_lock_is_exclusive() {
        let dir = scratch_dir("lock").join("nested");
        let lock = lock_data_dir(&dir).unwrap();
        let pid = std::process::id();
        assert_eq!(fs::read_to_string(lock.lock_path()).unwrap(), format!("{pid}\n"));
        let error = lock_data_dir(&dir).unwrap_err();
        assert!(matches!(error, DirError::Locked { holder_pid: Some(holder), .. } if holder == pid), "{error}");
        assert!(error.to_string().contains(&format!("pid {pid}")));
        drop(lock);
        let again = lock_data_dir(&dir).unwrap();
        drop(again);
        fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
}
