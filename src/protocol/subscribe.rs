//! The subscribe conversation: the request a subscriber sends,
//! `SUB <partition|*> <offset|earliest|latest>`, and every line it gets back:
//!
//! * `<partition> <offset> <key> <payload>`: one event ([`write_event_line`]);
//! * `TRUNCATED <partition> <requested-offset> <next-readable-offset>`: the
//!   cursor fell behind retention ([`write_truncated`]);
//! * `ERR <reason>: <detail>`: a bad request; the server then closes.
//!
//! [`parse_subscriber_line`] reads any of them back (for `spate sub`, the
//! bench's subscriber and the tests).

/// Which partitions a subscription reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionSelector {
    All,
    One(u32),
}

/// Where a subscription starts in each partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOffset {
    /// The oldest offset still retained.
    Earliest,
    /// The next offset to be written (only new events).
    Latest,
    /// An explicit offset; past retention gives a `TRUNCATED` notice.
    At(u64),
}

/// A parsed `SUB` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscribeRequest {
    pub partitions: PartitionSelector,
    pub start: StartOffset,
}

/// Why a `SUB` line was rejected; the text goes back as `ERR <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscribeError {
    NotSub,
    BadPartition { text: String },
    PartitionOutOfRange { partition: u64, partition_count: u32 },
    BadOffset { text: String },
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubscribeError::NotSub => {
                write!(f, "bad_request: expected SUB <partition|*> <offset|earliest|latest>")
            }
            SubscribeError::BadPartition { text } => {
                write!(f, "bad_partition: {text:?} is not a partition number or *")
            }
            SubscribeError::PartitionOutOfRange { partition, partition_count } => {
                write!(f, "partition_out_of_range: {partition} >= {partition_count} partitions")
            }
            SubscribeError::BadOffset { text } => {
                write!(f, "bad_offset: {text:?} is not an offset, earliest or latest")
            }
        }
    }
}

/// Parses a `SUB` line (without LF; a trailing CR is tolerated).
pub fn parse_subscribe(line: &[u8], partition_count: u32) -> Result<SubscribeRequest, SubscribeError> {
    let text = std::str::from_utf8(line).map_err(|_| SubscribeError::NotSub)?;
    let mut words = text.trim_end_matches('\r').split_ascii_whitespace();
    let (Some("SUB"), Some(partition), Some(offset), None) = (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(SubscribeError::NotSub);
    };
    let partitions = match partition {
        "*" => PartitionSelector::All,
        number => {
            let partition: u64 =
                number.parse().map_err(|_| SubscribeError::BadPartition { text: number.to_string() })?;
            if partition >= u64::from(partition_count) {
                return Err(SubscribeError::PartitionOutOfRange { partition, partition_count });
            }
            PartitionSelector::One(partition as u32)
        }
    };
    let start = match offset {
        "earliest" => StartOffset::Earliest,
        "latest" => StartOffset::Latest,
        number => StartOffset::At(number.parse().map_err(|_| SubscribeError::BadOffset { text: number.to_string() })?),
    };
    Ok(SubscribeRequest { partitions, start })
}

/// Appends one event line: `<partition> <offset> <key> <payload>\n`.
#[inline]
pub fn write_event_line(out: &mut Vec<u8>, partition: u32, offset: u64, key: &[u8], payload: &[u8]) {
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(numbers.format(partition).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(offset).as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b' ');
    out.extend_from_slice(payload);
    out.push(b'\n');
}

/// Bytes an event line takes besides its key and payload, at most (two
/// numbers of up to 20 digits and three separators and the LF).
pub const EVENT_LINE_OVERHEAD_MAX: usize = 10 + 20 + 4;

/// Appends `TRUNCATED <partition> <requested> <earliest>\n`.
pub fn write_truncated(out: &mut Vec<u8>, partition: u32, requested: u64, earliest: u64) {
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(b"TRUNCATED ");
    out.extend_from_slice(numbers.format(partition).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(requested).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(earliest).as_bytes());
    out.push(b'\n');
}

/// One line a subscriber reads (without LF), borrowing from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriberLine<'a> {
    Event {
        partition: u32,
        offset: u64,
        key: &'a [u8],
        payload: &'a [u8],
    },
    Truncated {
        partition: u32,
        requested: u64,
        earliest: u64,
    },
    /// `ERR ...`: the text after `ERR `.
    Error {
        text: &'a [u8],
    },
}

/// A subscriber line that is none of the documented ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSubscriberLine {
    pub line: String,
}

impl std::fmt::Display for BadSubscriberLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unexpected subscriber line {:?}", self.line)
    }
}

impl std::error::Error for BadSubscriberLine {}

/// Parses one line a subscriber received.
pub fn parse_subscriber_line(line: &[u8]) -> Result<SubscriberLine<'_>, BadSubscriberLine> {
    let bad = || BadSubscriberLine { line: String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned() };
    if let Some(text) = line.strip_prefix(b"ERR ") {
        return Ok(SubscriberLine::Error { text });
    }
    if let Some(rest) = line.strip_prefix(b"TRUNCATED ") {
        let mut numbers = rest.split(|&byte| byte == b' ').map(parse_number);
        let (Some(Some(partition)), Some(Some(requested)), Some(Some(earliest)), None) =
            (numbers.next(), numbers.next(), numbers.next(), numbers.next())
        else {
            return Err(bad());
        };
        let partition = u32::try_from(partition).map_err(|_| bad())?;
        return Ok(SubscriberLine::Truncated { partition, requested, earliest });
    }
    let mut fields = line.splitn(4, |&byte| byte == b' ');
    let partition = fields.next().and_then(parse_number).and_then(|number| u32::try_from(number).ok());
    let offset = fields.next().and_then(parse_number);
    let (Some(partition), Some(offset), Some(key), Some(payload)) = (partition, offset, fields.next(), fields.next())
    else {
        return Err(bad());
    };
    Ok(SubscriberLine::Event { partition, offset, key, payload })
}

fn parse_number(text: &[u8]) -> Option<u64> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line the server writes to a subscriber parses back exactly.
    #[test]
    fn subscriber_lines_round_trip() {
        let mut out = Vec::new();
        write_event_line(&mut out, 12, 3_000_000_000, b"user42", b"a b c");
        write_event_line(&mut out, 0, 0, b"k", b"");
        write_truncated(&mut out, 7, 5, 900);
        assert_eq!(out, b"12 3000000000 user42 a b c\n0 0 k \nTRUNCATED 7 5 900\n");
        let lines: Vec<_> = out.split(|&byte| byte == b'\n').filter(|line| !line.is_empty()).collect();
        assert_eq!(
            parse_subscriber_line(lines[0]),
            Ok(SubscriberLine::Event { partition: 12, offset: 3_000_000_000, key: b"user42", payload: b"a b c" })
        );
        assert_eq!(
            parse_subscriber_line(lines[1]),
            Ok(SubscriberLine::Event { partition: 0, offset: 0, key: b"k", payload: b"" })
        );
        assert_eq!(
            parse_subscriber_line(lines[2]),
            Ok(SubscriberLine::Truncated { partition: 7, requested: 5, earliest: 900 })
        );
        assert_eq!(parse_subscriber_line(b"ERR bad_request: x"), Ok(SubscriberLine::Error { text: b"bad_request: x" }));
        for bad in [&b"1 2 k"[..], b"x 2 k v", b"1 -2 k v", b"TRUNCATED 1 2", b"TRUNCATED 1 2 3 4", b""] {
            assert!(parse_subscriber_line(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// Valid requests parse; each kind of bad request gets its own error.
    #[test]
    fn subscribe_requests_parse_and_fail_clearly() {
        let all = parse_subscribe(b"SUB * earliest\r", 256).unwrap();
        assert_eq!(all, SubscribeRequest { partitions: PartitionSelector::All, start: StartOffset::Earliest });
        let one = parse_subscribe(b"SUB 17 42", 256).unwrap();
        assert_eq!(one, SubscribeRequest { partitions: PartitionSelector::One(17), start: StartOffset::At(42) });
        assert_eq!(parse_subscribe(b"SUB 3 latest", 4).unwrap().start, StartOffset::Latest);
        assert_eq!(parse_subscribe(b"GET / HTTP/1.1", 4), Err(SubscribeError::NotSub));
        assert_eq!(parse_subscribe(b"SUB 1", 4), Err(SubscribeError::NotSub));
        assert_eq!(parse_subscribe(b"SUB 1 2 3", 4), Err(SubscribeError::NotSub));
        assert!(matches!(parse_subscribe(b"SUB x 0", 4), Err(SubscribeError::BadPartition { .. })));
        assert!(matches!(parse_subscribe(b"SUB 4 0", 4), Err(SubscribeError::PartitionOutOfRange { .. })));
        assert!(matches!(parse_subscribe(b"SUB 1 -5", 4), Err(SubscribeError::BadOffset { .. })));
        assert_eq!(parse_subscribe(b"\xff\xfe", 4), Err(SubscribeError::NotSub));
    }
}
