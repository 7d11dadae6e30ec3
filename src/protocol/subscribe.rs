//! The subscribe conversation: the request a subscriber sends,
//! `SUB <partition|*> <offset|earliest|latest>`, and every line it gets back:
//!
//! * `<partition> <offset> <key> <payload>`: one event ([`write_event_line`]);
//! * `TRUNCATED <partition> <requested-offset> <next-readable-offset>`: the
//!   cursor fell behind retention ([`write_truncated`]);
//! * `ERR <reason>: <detail>`: a bad request, a limit or a timeout; the
//!   server then closes;
//! * `ERR offset_out_of_range <partition> <next-offset>`: the request asked
//!   for an offset past the end of a partition (the next offset to be
//!   written is the largest valid one); nothing else is written before it,
//!   and the server then closes ([`write_offset_out_of_range`]);
//! * `CLOSING <partition>:<resume> <partition>:<resume> ...`: the server is
//!   shutting down. It comes after every event already fetched for the
//!   subscriber and is the last line before the close. It names every
//!   partition of the subscription, in partition order, with where to
//!   resume: the offset of the next event the subscriber has not received,
//!   or `earliest`/`latest` for a partition whose start was never resolved
//!   (no event of it was sent). `SUB <partition> <resume>` against the next
//!   server continues without a gap or duplicate ([`write_closing_start`]).
//!
//! [`parse_subscriber_line`] reads any of them back (for `spate sub`, the
//! bench's subscriber and the tests).
//!
//! After its `SUB` line a subscriber sends nothing more; bytes it sends are
//! read and ignored, and end-of-file means it has gone (a subscriber that
//! closes its sending side ends its subscription).

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

/// A parsed `SUB` line: `SUB [<stream>] <partition|*> <offset|earliest|latest>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscribeRequest<'a> {
    /// The stream named, or `default` in the two-argument form.
    pub stream: &'a str,
    pub partitions: PartitionSelector,
    pub start: StartOffset,
}

impl SubscribeRequest<'_> {
    /// Checks the partition against the stream's partition count.
    pub fn check(&self, partition_count: u32) -> Result<(), SubscribeError> {
        match self.partitions {
            PartitionSelector::One(partition) if partition >= partition_count => {
                Err(SubscribeError::PartitionOutOfRange { partition: u64::from(partition), partition_count })
            }
            _ => Ok(()),
        }
    }
}

/// Why a `SUB` line was rejected; the text goes back as `ERR <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscribeError {
    NotSub,
    BadPartition { text: String },
    PartitionOutOfRange { partition: u64, partition_count: u32 },
    BadOffset { text: String },
    UnknownStream { stream: String },
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubscribeError::NotSub => {
                write!(f, "bad_request: expected SUB [<stream>] <partition|*> <offset|earliest|latest>")
            }
            SubscribeError::UnknownStream { stream } => write!(f, "unknown_stream: {stream}"),
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

/// Parses a `SUB` line (without LF; a trailing CR is tolerated). The
/// partition is checked against its stream by [`SubscribeRequest::check`].
pub fn parse_subscribe(line: &[u8]) -> Result<SubscribeRequest<'_>, SubscribeError> {
    let text = std::str::from_utf8(line).map_err(|_| SubscribeError::NotSub)?;
    let words: Vec<&str> = text.trim_end_matches('\r').split_ascii_whitespace().take(5).collect();
    let (stream, partition, offset) = match words.as_slice() {
        ["SUB", partition, offset] => (crate::stream::DEFAULT_STREAM, *partition, *offset),
        ["SUB", stream, partition, offset] => (*stream, *partition, *offset),
        _ => return Err(SubscribeError::NotSub),
    };
    let partitions = match partition {
        "*" => PartitionSelector::All,
        number => {
            let partition: u64 =
                number.parse().map_err(|_| SubscribeError::BadPartition { text: number.to_string() })?;
            let partition = u32::try_from(partition)
                .map_err(|_| SubscribeError::PartitionOutOfRange { partition, partition_count: u32::MAX })?;
            PartitionSelector::One(partition)
        }
    };
    let start = match offset {
        "earliest" => StartOffset::Earliest,
        "latest" => StartOffset::Latest,
        number => StartOffset::At(number.parse().map_err(|_| SubscribeError::BadOffset { text: number.to_string() })?),
    };
    Ok(SubscribeRequest { stream, partitions, start })
}

/// Appends one event line: `<partition> <offset> <key> <payload>\n`, the
/// key escaped (see [`unescape_key`]).
#[inline]
pub fn write_event_line(out: &mut Vec<u8>, partition: u32, offset: u64, key: &[u8], payload: &[u8]) {
    write_prefixed_event_line(out, &EventLinePrefix::new(partition, offset), key, payload);
}

/// Appends one event line that starts with `prefix` (its partition and
/// offset): the same bytes as [`write_event_line`].
#[inline]
pub fn write_prefixed_event_line(out: &mut Vec<u8>, prefix: &EventLinePrefix, key: &[u8], payload: &[u8]) {
    out.extend_from_slice(prefix.as_bytes());
    if key.iter().any(|&byte| needs_escape(byte)) {
        write_escaped_key(out, key);
    } else {
        out.extend_from_slice(key);
    }
    out.push(b' ');
    out.extend_from_slice(payload);
    out.push(b'\n');
}

/// The longest `<partition> <offset> ` an event line starts with: a `u32`
/// and a `u64` in decimal and two spaces.
const EVENT_LINE_PREFIX_SIZE_MAX: usize = 10 + 1 + 20 + 1;

/// The start of an event line, `<partition> <offset> `, kept as text so the
/// lines of consecutive offsets of one partition (a run of dense offsets)
/// format their numbers once: [`EventLinePrefix::advance`] counts the
/// offset's digits up in place instead.
#[derive(Debug, Clone, Copy)]
pub struct EventLinePrefix {
    bytes: [u8; EVENT_LINE_PREFIX_SIZE_MAX],
    size: usize,
    /// Where the offset's digits start.
    offset_at: usize,
}

impl EventLinePrefix {
    /// The prefix of `partition`'s line at `offset`, formatted once; later
    /// offsets of the run are reached with [`EventLinePrefix::advance`].
    pub fn new(partition: u32, offset: u64) -> EventLinePrefix {
        let mut prefix = EventLinePrefix { bytes: [0; EVENT_LINE_PREFIX_SIZE_MAX], size: 0, offset_at: 0 };
        let mut numbers = itoa::Buffer::new();
        prefix.push(numbers.format(partition).as_bytes());
        prefix.push(b" ");
        prefix.offset_at = prefix.size;
        prefix.push(numbers.format(offset).as_bytes());
        prefix.push(b" ");
        prefix
    }

    fn push(&mut self, bytes: &[u8]) {
        self.bytes[self.size..self.size + bytes.len()].copy_from_slice(bytes);
        self.size += bytes.len();
    }

    /// Moves to the next offset. The offset must be below `u64::MAX`.
    #[inline]
    pub fn advance(&mut self) {
        let last_digit = self.size - 2;
        for at in (self.offset_at..=last_digit).rev() {
            if self.bytes[at] != b'9' {
                self.bytes[at] += 1;
                return;
            }
            self.bytes[at] = b'0';
        }
        // All nines: one digit more (`99 ` to `100 `), which a `u64` below
        // its maximum always has room for.
        debug_assert!(self.size < EVENT_LINE_PREFIX_SIZE_MAX, "advanced past u64::MAX");
        if self.size < EVENT_LINE_PREFIX_SIZE_MAX {
            self.bytes[self.offset_at] = b'1';
            self.bytes[self.size - 1] = b'0';
            self.bytes[self.size] = b' ';
            self.size += 1;
        }
    }

    /// The prefix as the line starts: `<partition> <offset> `.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.size]
    }
}

/// Bytes an event line takes besides its key and payload, at most (two
/// numbers of up to 20 digits and three separators and the LF).
pub const EVENT_LINE_OVERHEAD_MAX: usize = 10 + 20 + 4;

/// The most bytes an event line of `key` and `payload` takes (an escaped
/// key takes at most twice its size).
#[inline]
pub fn event_line_size_max(key: &[u8], payload: &[u8]) -> usize {
    2 * key.len() + payload.len() + EVENT_LINE_OVERHEAD_MAX
}

/// Key bytes that cannot appear raw in an event line: the separator, the
/// line end, and the escape character itself. Keys of the `KEY PAYLOAD`
/// format have no space or LF; JSON and ILP keys may.
#[inline]
fn needs_escape(byte: u8) -> bool {
    matches!(byte, b' ' | b'\n' | b'\r' | b'\\')
}

fn write_escaped_key(out: &mut Vec<u8>, key: &[u8]) {
    for &byte in key {
        match byte {
            b' ' => out.extend_from_slice(b"\\s"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\\' => out.extend_from_slice(b"\\\\"),
            other => out.push(other),
        }
    }
}

/// The key of an event line as it was ingested: a subscriber line writes
/// a key's `\`, space, LF and CR as `\\`, `\s`, `\n` and `\r` (so the key
/// is one space-free field). Borrows when there is nothing to unescape; an
/// unknown escape is kept as written.
pub fn unescape_key(key: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if !key.contains(&b'\\') {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut out = Vec::with_capacity(key.len());
    let mut bytes = key.iter().copied();
    while let Some(byte) = bytes.next() {
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        match bytes.next() {
            Some(b's') => out.push(b' '),
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b'\\') => out.push(b'\\'),
            Some(other) => out.extend_from_slice(&[b'\\', other]),
            None => out.push(b'\\'),
        }
    }
    std::borrow::Cow::Owned(out)
}

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

/// Appends `ERR offset_out_of_range <partition> <next-offset>\n`.
pub fn write_offset_out_of_range(out: &mut Vec<u8>, partition: u32, next_offset: u64) {
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(b"ERR offset_out_of_range ");
    out.extend_from_slice(numbers.format(partition).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(next_offset).as_bytes());
    out.push(b'\n');
}

/// Starts a `CLOSING` notice; follow with one [`write_closing_entry`] per
/// partition and [`write_closing_end`]. The caller may write the buffer out
/// between entries, so a notice for many partitions is never built whole.
pub fn write_closing_start(out: &mut Vec<u8>) {
    out.extend_from_slice(b"CLOSING");
}

/// Appends ` <partition>:<resume>` to a `CLOSING` notice.
pub fn write_closing_entry(out: &mut Vec<u8>, partition: u32, resume: StartOffset) {
    let mut numbers = itoa::Buffer::new();
    out.push(b' ');
    out.extend_from_slice(numbers.format(partition).as_bytes());
    out.push(b':');
    match resume {
        StartOffset::At(offset) => out.extend_from_slice(numbers.format(offset).as_bytes()),
        StartOffset::Earliest => out.extend_from_slice(b"earliest"),
        StartOffset::Latest => out.extend_from_slice(b"latest"),
    }
}

/// Ends a `CLOSING` notice.
pub fn write_closing_end(out: &mut Vec<u8>) {
    out.push(b'\n');
}

/// The positions of a `CLOSING` notice (the text after `CLOSING`), in order;
/// an entry that does not parse is an error.
pub fn closing_positions(text: &[u8]) -> impl Iterator<Item = Result<(u32, StartOffset), BadSubscriberLine>> + '_ {
    text.split(|&byte| byte == b' ').filter(|entry| !entry.is_empty()).map(|entry| {
        let bad = || BadSubscriberLine { line: String::from_utf8_lossy(&entry[..entry.len().min(200)]).into_owned() };
        let colon = memchr::memchr(b':', entry).ok_or_else(bad)?;
        let partition = parse_number(&entry[..colon]).and_then(|number| u32::try_from(number).ok()).ok_or_else(bad)?;
        let resume = match &entry[colon + 1..] {
            b"earliest" => StartOffset::Earliest,
            b"latest" => StartOffset::Latest,
            number => StartOffset::At(parse_number(number).ok_or_else(bad)?),
        };
        Ok((partition, resume))
    })
}

/// One line a subscriber reads (without LF), borrowing from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriberLine<'a> {
    Event {
        partition: u32,
        offset: u64,
        /// The key as written on the line: escaped ([`unescape_key`]).
        key: &'a [u8],
        payload: &'a [u8],
    },
    Truncated {
        partition: u32,
        requested: u64,
        earliest: u64,
    },
    /// `ERR offset_out_of_range <partition> <next-offset>`.
    OffsetOutOfRange {
        partition: u32,
        next_offset: u64,
    },
    /// `ERR ...`: the text after `ERR ` (any other error).
    Error {
        text: &'a [u8],
    },
    /// `CLOSING ...`: the text after `CLOSING` (see [`closing_positions`]).
    Closing {
        positions: &'a [u8],
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
    if let Some(numbers) = line.strip_prefix(b"ERR offset_out_of_range ") {
        let mut numbers = numbers.split(|&byte| byte == b' ').map(parse_number);
        let (Some(Some(partition)), Some(Some(next_offset)), None) = (numbers.next(), numbers.next(), numbers.next())
        else {
            return Err(bad());
        };
        let partition = u32::try_from(partition).map_err(|_| bad())?;
        return Ok(SubscriberLine::OffsetOutOfRange { partition, next_offset });
    }
    if let Some(text) = line.strip_prefix(b"ERR ") {
        return Ok(SubscriberLine::Error { text });
    }
    if line == b"CLOSING" || line.starts_with(b"CLOSING ") {
        return Ok(SubscriberLine::Closing { positions: &line[b"CLOSING".len()..] });
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
    use proptest::strategy::Strategy;

    /// Keys with spaces, line ends and backslashes (JSON and ILP keys) stay
    /// one field and come back byte for byte.
    #[test]
    fn keys_are_escaped_and_unescaped() {
        let keys: [&[u8]; 5] = [b"plain", b"a b", b"weather,city=Z\\ rich", b"line\nbreak\r", b"\\s"];
        for key in keys {
            let mut out = Vec::new();
            write_event_line(&mut out, 1, 2, key, b"pay load");
            let line = &out[..out.len() - 1];
            assert!(!line.contains(&b'\n'));
            let Ok(SubscriberLine::Event { key: written, payload, .. }) = parse_subscriber_line(line) else {
                panic!("{line:?}")
            };
            assert_eq!((unescape_key(written).as_ref(), payload), (key, &b"pay load"[..]));
        }
        let mut out = Vec::new();
        write_event_line(&mut out, 1, 2, b"a b\\", b"p");
        assert_eq!(out, b"1 2 a\\sb\\\\ p\n");
    }

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
        let all = parse_subscribe(b"SUB * earliest\r").unwrap();
        let partitions = PartitionSelector::All;
        assert_eq!(all, SubscribeRequest { stream: "default", partitions, start: StartOffset::Earliest });
        let one = parse_subscribe(b"SUB 17 42").unwrap();
        let partitions = PartitionSelector::One(17);
        assert_eq!(one, SubscribeRequest { stream: "default", partitions, start: StartOffset::At(42) });
        let named = parse_subscribe(b"SUB clicks 3 latest").unwrap();
        let partitions = PartitionSelector::One(3);
        assert_eq!(named, SubscribeRequest { stream: "clicks", partitions, start: StartOffset::Latest });
        assert_eq!(parse_subscribe(b"GET / HTTP/1.1"), Err(SubscribeError::NotSub));
        assert_eq!(parse_subscribe(b"SUB 1"), Err(SubscribeError::NotSub));
        assert_eq!(parse_subscribe(b"SUB s 1 2 3"), Err(SubscribeError::NotSub));
        assert!(matches!(parse_subscribe(b"SUB x 0"), Err(SubscribeError::BadPartition { .. })));
        assert!(matches!(
            parse_subscribe(b"SUB 4 0").unwrap().check(4),
            Err(SubscribeError::PartitionOutOfRange { .. })
        ));
        assert!(parse_subscribe(b"SUB 3 0").unwrap().check(4).is_ok());
        assert!(matches!(parse_subscribe(b"SUB 1 -5"), Err(SubscribeError::BadOffset { .. })));
        assert_eq!(parse_subscribe(b"\xff\xfe"), Err(SubscribeError::NotSub));
        let past_end = parse_subscribe(b"SUB * 18446744073709551615").unwrap();
        assert_eq!(past_end.start, StartOffset::At(u64::MAX), "the largest offset parses (the owner refuses it)");
    }

    /// The out-of-range error and the closing notice parse back into what
    /// was written, chunked or not.
    #[test]
    fn closing_and_out_of_range_round_trip() {
        let mut out = Vec::new();
        write_offset_out_of_range(&mut out, 3, 120);
        assert_eq!(out, b"ERR offset_out_of_range 3 120\n");
        let line = &out[..out.len() - 1];
        assert_eq!(
            parse_subscriber_line(line),
            Ok(SubscriberLine::OffsetOutOfRange { partition: 3, next_offset: 120 })
        );
        let positions = [(0, StartOffset::At(5)), (1, StartOffset::Earliest), (7, StartOffset::Latest)];
        let mut written = Vec::new();
        write_closing_start(&mut written);
        for (partition, resume) in positions {
            write_closing_entry(&mut written, partition, resume);
        }
        write_closing_end(&mut written);
        assert_eq!(written, b"CLOSING 0:5 1:earliest 7:latest\n");
        let Ok(SubscriberLine::Closing { positions: text }) = parse_subscriber_line(&written[..written.len() - 1])
        else {
            panic!("a closing notice")
        };
        let parsed: Vec<_> = closing_positions(text).collect::<Result<_, _>>().unwrap();
        assert_eq!(parsed, positions);
        assert!(closing_positions(b" 1:x").next().unwrap().is_err());
        assert!(parse_subscriber_line(b"ERR offset_out_of_range 1").is_err());
    }

    proptest::proptest! {
        /// A prefix counted up from any offset is the prefix of that offset
        /// written anew, across every carry (`9` to `10`, `99..9` to
        /// `100..0`), up to the largest offset.
        #[test]
        fn prefixes_count_offsets_up(
            partition in proptest::prelude::any::<u32>(),
            digits in 1u32..=19,
            below in 0u64..3,
            steps in 0u64..300,
        ) {
            let start = (10u64.pow(digits) - 1).saturating_sub(below + steps / 2);
            let mut prefix = EventLinePrefix::new(partition, start);
            for step in 0..steps {
                let expected = EventLinePrefix::new(partition, start + step);
                proptest::prop_assert_eq!(prefix.as_bytes(), expected.as_bytes());
                let written = format!("{partition} {} ", start + step);
                proptest::prop_assert_eq!(prefix.as_bytes(), written.as_bytes());
                prefix.advance();
            }
            let mut last = EventLinePrefix::new(partition, u64::MAX - 1);
            last.advance();
            let largest = format!("{partition} {} ", u64::MAX);
            proptest::prop_assert_eq!(last.as_bytes(), largest.as_bytes());
        }

        /// Any `SUB` line parses or fails without panicking; a well-formed one
        /// parses back to what was written, up to the largest offset, and a
        /// partition past the count is refused with its numbers.
        #[test]
        fn subscribe_requests_round_trip(
            partition in proptest::option::of(0u64..=u64::from(u32::MAX) + 1),
            start in proptest::prop_oneof![
                proptest::strategy::Just(StartOffset::Earliest),
                proptest::strategy::Just(StartOffset::Latest),
                proptest::prelude::any::<u64>().prop_map(StartOffset::At),
            ],
            partition_count in 1u32..=65_536,
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let partition_text = partition.map_or("*".to_string(), |partition| partition.to_string());
            let start_text = match start {
                StartOffset::Earliest => "earliest".to_string(),
                StartOffset::Latest => "latest".to_string(),
                StartOffset::At(offset) => offset.to_string(),
            };
            let line = format!("SUB {partition_text} {start_text}\r");
            let checked = parse_subscribe(line.as_bytes()).and_then(|request| request.check(partition_count).map(|()| request));
            match (checked, partition) {
                (Ok(request), None) => {
                    let all = PartitionSelector::All;
                    proptest::prop_assert_eq!(request, SubscribeRequest { stream: "default", partitions: all, start });
                }
                (Ok(request), Some(partition)) => {
                    proptest::prop_assert!(partition < u64::from(partition_count));
                    let partitions = PartitionSelector::One(partition as u32);
                    proptest::prop_assert_eq!(request, SubscribeRequest { stream: "default", partitions, start });
                }
                (Err(SubscribeError::PartitionOutOfRange { partition: refused, partition_count: count }), Some(partition)) => {
                    proptest::prop_assert_eq!(refused, partition);
                    proptest::prop_assert!(count == partition_count || (count == u32::MAX && partition > u64::from(u32::MAX)));
                }
                (Err(error), _) => proptest::prop_assert!(false, "{error}"),
            }
            let _ = parse_subscribe(&noise);
            let _ = parse_subscriber_line(&noise);
        }
    }
}
