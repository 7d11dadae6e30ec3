//! An overlong line on the subscribe port, measured before it is refused.
//!
//! A line past its limit is not kept: its bytes are read and dropped up to
//! its LF, counting them, so that the `ERR` names its real size ("line of
//! 100000 bytes"), not the size of whatever buffer the reader happened to
//! hold when it noticed. When the reader gives up before the LF (a request
//! line past [`SUBSCRIBE_REQUEST_SKIP_BYTES_MAX`]), it says
//! only what it knows: "at least N bytes". Memory stays one read chunk.

use futures_lite::{AsyncRead, AsyncReadExt};

/// How far the subscribe port reads (and drops) a first line past its limit
/// to tell its real size in the `ERR`; past this it says "at least" and
/// closes.
pub(super) const SUBSCRIBE_REQUEST_SKIP_BYTES_MAX: usize = 1024 * 1024;
/// Bytes one read of an overlong line takes.
const CHUNK_BYTES: usize = 4096;

/// What reading the rest of an overlong line found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Overlong {
    /// The line ended: its size without the LF, and the bytes read after it.
    Measured { line_size: usize, rest: Vec<u8> },
    /// `line_size_min` bytes were read and none was an LF: the reader
    /// stopped there (its limit), so the line is at least that long.
    Unfinished { line_size_min: usize },
    /// The peer closed (or the read failed) before the LF.
    Closed,
}

/// Reads and drops the rest of a line of which `seen_bytes` were read (with
/// no LF among them), up to its LF or until `skip_bytes_max` bytes of it
/// were read in all.
pub(super) async fn skip_overlong<R: AsyncRead + Unpin>(
    reader: &mut R,
    seen_bytes: usize,
    skip_bytes_max: usize,
) -> Overlong {
    let mut chunk = [0u8; CHUNK_BYTES];
    let mut line_size = seen_bytes;
    loop {
        if line_size >= skip_bytes_max {
            return Overlong::Unfinished { line_size_min: line_size };
        }
        let count = match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return Overlong::Closed,
            Ok(count) => count,
        };
        if let Some(end) = memchr::memchr(b'\n', &chunk[..count]) {
            let rest = chunk[end + 1..count].to_vec();
            return Overlong::Measured { line_size: line_size.saturating_add(end), rest };
        }
        line_size = line_size.saturating_add(count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip(input: &[u8], seen_bytes: usize, skip_bytes_max: usize) -> Overlong {
        let mut reader = futures_lite::io::Cursor::new(input.to_vec());
        futures_lite::future::block_on(skip_overlong(&mut reader, seen_bytes, skip_bytes_max))
    }

    /// Lines of different sizes are measured to the byte, whatever the
    /// chunking; what follows the LF is kept; a reader that stops says how
    /// far it read; a peer that closes mid-line gets nothing.
    #[test]
    fn overlong_lines_are_measured_or_bounded_honestly() {
        for size in [5_000usize, 100_000] {
            let mut input = vec![b'x'; size - 1024];
            input.extend_from_slice(b"\nCOMMIT 0 1\n");
            let found = skip(&input, 1024, usize::MAX);
            assert_eq!(found, Overlong::Measured { line_size: size, rest: b"COMMIT 0 1\n".to_vec() });
        }
        let endless = vec![b'x'; 3 * CHUNK_BYTES];
        assert_eq!(
            skip(&endless, 1280, 2 * CHUNK_BYTES),
            Overlong::Unfinished { line_size_min: 1280 + 2 * CHUNK_BYTES }
        );
        assert_eq!(skip(&endless, 1280, usize::MAX), Overlong::Closed);
        assert_eq!(skip(b"\n", 2000, usize::MAX), Overlong::Measured { line_size: 2000, rest: Vec::new() });
    }
}
