//! The subscribe request: `SUB <partition|*> <offset|earliest|latest>`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
