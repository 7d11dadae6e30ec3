//! The consumer-group conversation on the subscribe port, both directions.
//!
//! A connection whose first line is `GROUP` (instead of `SUB`) is a member of
//! a consumer group. What the member sends, one line each:
//!
//! * `GROUP <stream> <group> [earliest|latest] [hold]`: join (first line
//!   only). Names are 1 to 64 bytes of `[a-z0-9._-]`, and neither `.` nor
//!   `..` (they name directories). `earliest|latest` says where this member
//!   starts in a partition the group has never committed (default `latest`,
//!   as Kafka's `auto.offset.reset`); `hold` asks for consumer backpressure
//!   (see [`crate::group`]). The options come in either order, each at most
//!   once.
//! * `COMMIT <partition> <next-offset>`: the group has processed every event
//!   of the partition before `next-offset` (Kafka's convention: the next
//!   offset to read).
//! * `PING`: a heartbeat, answered with nothing. Any line is a heartbeat; a
//!   member that commits often need not ping.
//! * `LEAVE`: the member goes. The server answers the commits sent before it,
//!   then closes; the member's partitions move at once instead of after the
//!   session timeout.
//!
//! What the server sends, one line each:
//!
//! * `ASSIGNED <generation> <p,p,...>` (or `-` for none): the member's full
//!   set of partitions from now on ([`write_assigned`]);
//! * `<partition> <offset> <key> <payload>`: one event, exactly as a `SUB`
//!   subscriber gets it ([`crate::protocol::subscribe::write_event_line`]),
//!   and `TRUNCATED ...`/`CLOSING ...` as there;
//! * `REVOKED <generation> <p,...>`: no event of these partitions follows on
//!   this connection ([`write_revoked`]); an `ASSIGNED` with the member's
//!   remaining set follows;
//! * `OK COMMIT <partition> <next-offset>`: that commit is durable
//!   ([`write_commit_ok`]);
//! * `ERR <reason>: <detail>` ([`GroupError`]): a refused commit keeps the
//!   connection open and changes nothing; any other error is the last line
//!   before the server closes ([`GroupError::closes_connection`]).
//!
//! Partition lists are decimal partition numbers in ascending order, joined
//! by commas without spaces. Parsing borrows from the line and allocates
//! nothing, errors included (they borrow the offending text); event lines are
//! parsed by [`crate::protocol::subscribe::parse_subscriber_line`].

use std::fmt;

use crate::protocol::subscribe::{BadSubscriberLine, SubscriberLine, parse_subscriber_line};

/// Longest stream or group name, in bytes.
pub const GROUP_NAME_SIZE_MAX: usize = 64;
pub use crate::config::limits::GROUP_REQUEST_SIZE_MAX;
/// Bytes an `ASSIGNED`/`REVOKED` line takes besides its partition list, at
/// most: the word, a 20-digit generation, two spaces and the LF.
pub const PARTITION_LIST_LINE_OVERHEAD_MAX: usize = 8 + 20 + 2 + 1;
/// Bytes one partition takes in a list, at most: 10 digits and a comma.
pub const PARTITION_LIST_ENTRY_SIZE_MAX: usize = 11;
/// How many bytes of offending text an error shows.
const SHOWN_SIZE_MAX: usize = 32;

/// Where a member starts in a partition its group has never committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    /// The oldest retained event.
    Earliest,
    /// Only events written from now on (Kafka's default).
    #[default]
    Latest,
}

/// A parsed `GROUP` line, borrowing the names from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinRequest<'a> {
    pub stream: &'a str,
    pub group: &'a str,
    pub reset: OffsetReset,
    pub hold: bool,
}

/// One line a member sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRequest<'a> {
    Join(JoinRequest<'a>),
    Commit { partition: u32, next_offset: u64 },
    Ping,
    Leave,
}

/// The commands a member may send, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupCommand {
    Group,
    Commit,
    Ping,
    Leave,
}

impl GroupCommand {
    fn usage(self) -> &'static str {
        match self {
            GroupCommand::Group => "GROUP <stream> <group> [earliest|latest] [hold]",
            GroupCommand::Commit => "COMMIT <partition> <next-offset>",
            GroupCommand::Ping => "PING",
            GroupCommand::Leave => "LEAVE",
        }
    }
}

/// Which name of a `GROUP` line is bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameField {
    Stream,
    Group,
}

/// Which number of a `COMMIT` line is bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberField {
    Partition,
    NextOffset,
}

/// Why a member's line does not parse: `ERR bad_request: ...`. Borrows the
/// offending text (shown up to 32 bytes), so it allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError<'a> {
    /// The first word is none of `GROUP`, `COMMIT`, `PING`, `LEAVE` (a `SUB`
    /// line lands here: the caller tries [`crate::protocol::parse_subscribe`]).
    UnknownCommand { command: &'a [u8] },
    /// The command has too few or too many words.
    WrongArgumentCount { command: GroupCommand, argument_count: usize },
    /// A name is not 1 to [`GROUP_NAME_SIZE_MAX`] bytes of `[a-z0-9._-]`, or
    /// is `.` or `..`.
    BadName { field: NameField, name: &'a [u8] },
    /// A number is not decimal digits, or does not fit (`u32` partition, `u64` offset).
    BadNumber { field: NumberField, text: &'a [u8] },
    /// A `GROUP` option that is not `earliest`, `latest` or `hold`.
    UnknownOption { option: &'a [u8] },
    /// An option given twice (`earliest latest`, `hold hold`).
    RepeatedOption { option: &'a [u8] },
    /// The line is longer than [`GROUP_REQUEST_SIZE_MAX`].
    TooLong { line_size: usize },
}

fn shown(text: &[u8]) -> String {
    String::from_utf8_lossy(&text[..text.len().min(SHOWN_SIZE_MAX)]).into_owned()
}

impl fmt::Display for RequestError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestError::UnknownCommand { command } => {
                write!(f, "bad_request: unknown command {:?} (known: GROUP, COMMIT, PING, LEAVE)", shown(command))
            }
            RequestError::WrongArgumentCount { command, argument_count } => {
                write!(f, "bad_request: {argument_count} arguments; usage: {}", command.usage())
            }
            RequestError::BadName { field, name } => {
                let field = if *field == NameField::Stream { "stream" } else { "group" };
                write!(
                    f,
                    "bad_request: {field} name {:?} ({} bytes) is not 1 to {GROUP_NAME_SIZE_MAX} of [a-z0-9._-] \
                     (and not . or ..)",
                    shown(name),
                    name.len()
                )
            }
            RequestError::BadNumber { field, text } => {
                let (field, kind) = match field {
                    NumberField::Partition => ("partition", "u32"),
                    NumberField::NextOffset => ("next-offset", "u64"),
                };
                write!(f, "bad_request: {field} {:?} is not a decimal {kind}", shown(text))
            }
            RequestError::UnknownOption { option } => {
                write!(f, "bad_request: option {:?} is not earliest, latest or hold", shown(option))
            }
            RequestError::RepeatedOption { option } => {
                write!(f, "bad_request: option {:?} given twice", shown(option))
            }
            RequestError::TooLong { line_size } => {
                write!(f, "bad_request: line of {line_size} bytes, limit {GROUP_REQUEST_SIZE_MAX}")
            }
        }
    }
}

/// Whether `name` is a valid stream or group name: 1 to 64 bytes of
/// `[a-z0-9._-]`, and not `.` or `..`.
pub fn is_valid_name(name: &[u8]) -> bool {
    let allowed = |byte: &u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || matches!(byte, b'.' | b'_' | b'-');
    !name.is_empty() && name.len() <= GROUP_NAME_SIZE_MAX && name != b"." && name != b".." && name.iter().all(allowed)
}

/// Most words a member's line has (`GROUP` with both options).
const WORDS_MAX: usize = 5;

/// Parses one line a member sent (without LF; a trailing CR is tolerated).
/// Words are separated by runs of ASCII whitespace.
pub fn parse_group_request(line: &[u8]) -> Result<GroupRequest<'_>, RequestError<'_>> {
    if line.len() > GROUP_REQUEST_SIZE_MAX {
        return Err(RequestError::TooLong { line_size: line.len() });
    }
    let mut words: [&[u8]; WORDS_MAX] = [b""; WORDS_MAX];
    let mut word_count = 0;
    for word in line.split(u8::is_ascii_whitespace).filter(|word| !word.is_empty()) {
        if word_count < WORDS_MAX {
            words[word_count] = word;
        }
        word_count += 1;
    }
    let arguments = &words[1..word_count.clamp(1, WORDS_MAX)];
    let argument_count = word_count.saturating_sub(1);
    let (command, arguments_min, arguments_max) = match words[0] {
        b"GROUP" => (GroupCommand::Group, 2, 4),
        b"COMMIT" => (GroupCommand::Commit, 2, 2),
        b"PING" => (GroupCommand::Ping, 0, 0),
        b"LEAVE" => (GroupCommand::Leave, 0, 0),
        command => return Err(RequestError::UnknownCommand { command }),
    };
    if !(arguments_min..=arguments_max).contains(&argument_count) {
        return Err(RequestError::WrongArgumentCount { command, argument_count });
    }
    match command {
        GroupCommand::Group => parse_join(arguments).map(GroupRequest::Join),
        GroupCommand::Commit => {
            let partition = parse_decimal(arguments[0])
                .and_then(|number| u32::try_from(number).ok())
                .ok_or(RequestError::BadNumber { field: NumberField::Partition, text: arguments[0] })?;
            let next_offset = parse_decimal(arguments[1])
                .ok_or(RequestError::BadNumber { field: NumberField::NextOffset, text: arguments[1] })?;
            Ok(GroupRequest::Commit { partition, next_offset })
        }
        GroupCommand::Ping => Ok(GroupRequest::Ping),
        GroupCommand::Leave => Ok(GroupRequest::Leave),
    }
}

fn parse_join<'a>(arguments: &[&'a [u8]]) -> Result<JoinRequest<'a>, RequestError<'a>> {
    let name = |field: NameField, name: &'a [u8]| {
        // Valid names are ASCII, so the conversion cannot fail after the check.
        is_valid_name(name)
            .then(|| std::str::from_utf8(name).ok())
            .flatten()
            .ok_or(RequestError::BadName { field, name })
    };
    let stream = name(NameField::Stream, arguments[0])?;
    let group = name(NameField::Group, arguments[1])?;
    let (mut reset, mut hold) = (None, false);
    for &option in &arguments[2..] {
        match option {
            b"earliest" | b"latest" if reset.is_some() => return Err(RequestError::RepeatedOption { option }),
            b"earliest" => reset = Some(OffsetReset::Earliest),
            b"latest" => reset = Some(OffsetReset::Latest),
            b"hold" if hold => return Err(RequestError::RepeatedOption { option }),
            b"hold" => hold = true,
            _ => return Err(RequestError::UnknownOption { option }),
        }
    }
    Ok(JoinRequest { stream, group, reset: reset.unwrap_or_default(), hold })
}

/// Decimal digits only (no sign, no spaces), fitting a `u64`.
fn parse_decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    text.iter().try_fold(0u64, |value, &byte| {
        let digit = byte.checked_sub(b'0').filter(|digit| *digit <= 9)?;
        value.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Appends `GROUP <stream> <group> <earliest|latest>[ hold]\n` (for clients).
pub fn write_join(out: &mut Vec<u8>, request: &JoinRequest<'_>) {
    debug_assert!(is_valid_name(request.stream.as_bytes()) && is_valid_name(request.group.as_bytes()));
    out.extend_from_slice(b"GROUP ");
    out.extend_from_slice(request.stream.as_bytes());
    out.push(b' ');
    out.extend_from_slice(request.group.as_bytes());
    out.extend_from_slice(if request.reset == OffsetReset::Earliest { b" earliest" } else { b" latest" });
    if request.hold {
        out.extend_from_slice(b" hold");
    }
    out.push(b'\n');
}

/// Appends `COMMIT <partition> <next-offset>\n` (for clients).
pub fn write_commit(out: &mut Vec<u8>, partition: u32, next_offset: u64) {
    write_word_numbers(out, b"COMMIT ", partition, next_offset);
}

/// Appends `PING\n` (for clients).
pub fn write_ping(out: &mut Vec<u8>) {
    out.extend_from_slice(b"PING\n");
}

/// Appends `LEAVE\n` (for clients).
pub fn write_leave(out: &mut Vec<u8>) {
    out.extend_from_slice(b"LEAVE\n");
}

/// Appends `ASSIGNED <generation> <p,p,...>\n`, or `-` for no partition.
/// `partitions` must be strictly ascending.
pub fn write_assigned(out: &mut Vec<u8>, generation: u64, partitions: &[u32]) {
    write_partition_list_line(out, b"ASSIGNED ", generation, partitions);
}

/// Appends `REVOKED <generation> <p,...>\n`. `partitions` must be strictly
/// ascending (and is never empty when the coordinator asks for it).
pub fn write_revoked(out: &mut Vec<u8>, generation: u64, partitions: &[u32]) {
    write_partition_list_line(out, b"REVOKED ", generation, partitions);
}

fn write_partition_list_line(out: &mut Vec<u8>, word: &[u8], generation: u64, partitions: &[u32]) {
    debug_assert!(partitions.windows(2).all(|pair| pair[0] < pair[1]), "partition lists are strictly ascending");
    out.reserve(PARTITION_LIST_LINE_OVERHEAD_MAX + partitions.len() * PARTITION_LIST_ENTRY_SIZE_MAX);
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(word);
    out.extend_from_slice(numbers.format(generation).as_bytes());
    out.push(b' ');
    if partitions.is_empty() {
        out.push(b'-');
    }
    for (index, partition) in partitions.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.extend_from_slice(numbers.format(*partition).as_bytes());
    }
    out.push(b'\n');
}

/// Appends `OK COMMIT <partition> <next-offset>\n`.
pub fn write_commit_ok(out: &mut Vec<u8>, partition: u32, next_offset: u64) {
    write_word_numbers(out, b"OK COMMIT ", partition, next_offset);
}

fn write_word_numbers(out: &mut Vec<u8>, word: &[u8], partition: u32, offset: u64) {
    let mut numbers = itoa::Buffer::new();
    out.extend_from_slice(word);
    out.extend_from_slice(numbers.format(partition).as_bytes());
    out.push(b' ');
    out.extend_from_slice(numbers.format(offset).as_bytes());
    out.push(b'\n');
}

/// Appends `ERR <reason>: <detail>\n`.
pub fn write_group_error(out: &mut Vec<u8>, error: &GroupError<'_>) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = writeln!(out, "ERR {error}");
}

/// Every `ERR` a member can get, with the numbers it needs. Display is
/// `<reason>: <detail>`; [`GroupError::reason`] is the reason alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupError<'a> {
    /// The line does not parse, or comes at the wrong time (`COMMIT` before
    /// `GROUP`, a second `GROUP`). After a join the connection stays open.
    BadRequest(RequestError<'a>),
    /// A second `GROUP` line on a member's connection.
    AlreadyJoined,
    /// The `GROUP` line names a stream the server does not have.
    UnknownStream { stream: &'a str },
    /// The `GROUP` line names a replicated stream: groups are kept per node
    /// and are not cluster-wide yet (README, "Cluster").
    ReplicatedStream { stream: &'a str },
    /// The coordinator's shard has `groups_max` groups already.
    GroupLimit { groups_max: usize },
    /// The group has `members_max` members already (live ones and expelled
    /// ones whose connections are still closing).
    MemberLimit { members_max: usize },
    /// The group has live members and its `hold` mode differs from the
    /// request's: a group's mode changes only while it has no live member.
    HoldMismatch { group_hold: bool },
    /// A commit for a partition the stream does not have.
    PartitionOutOfRange { partition: u32, partition_count: u32 },
    /// A commit for a partition this member does not hold (never assigned,
    /// or its `REVOKED` line was already sent).
    NotAssigned { partition: u32 },
    /// A commit past the partition's end (the next offset to be written).
    OffsetOutOfRange { partition: u32, next_offset: u64, partition_end: u64 },
    /// The member sent no line within the session timeout; its partitions
    /// are reassigned.
    SessionTimeout { session_timeout_ms: u64 },
    /// The member did not read its `REVOKED` line within the revoke timeout
    /// (its socket stayed full), so the partitions it was giving up were stuck.
    RevokeTimeout { revoke_timeout_ms: u64 },
}

impl GroupError<'_> {
    /// The reason word of the `ERR` line.
    pub fn reason(&self) -> &'static str {
        match self {
            GroupError::BadRequest(_) => "bad_request",
            GroupError::AlreadyJoined => "bad_request",
            GroupError::UnknownStream { .. } => "unknown_stream",
            GroupError::ReplicatedStream { .. } => "replicated_stream",
            GroupError::GroupLimit { .. } => "group_limit",
            GroupError::MemberLimit { .. } => "member_limit",
            GroupError::HoldMismatch { .. } => "hold_mismatch",
            GroupError::PartitionOutOfRange { .. } => "partition_out_of_range",
            GroupError::NotAssigned { .. } => "not_assigned",
            GroupError::OffsetOutOfRange { .. } => "offset_out_of_range",
            GroupError::SessionTimeout { .. } => "session_timeout",
            GroupError::RevokeTimeout { .. } => "revoke_timeout",
        }
    }

    /// Whether the server closes the connection after this error. Refused
    /// commits and bad lines after a join keep it; the caller knows whether
    /// the member has joined, so a bad first line is closed by the caller.
    pub fn closes_connection(&self) -> bool {
        !matches!(
            self,
            GroupError::BadRequest(_)
                | GroupError::AlreadyJoined
                | GroupError::PartitionOutOfRange { .. }
                | GroupError::NotAssigned { .. }
                | GroupError::OffsetOutOfRange { .. }
        )
    }
}

impl fmt::Display for GroupError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupError::BadRequest(error) => write!(f, "{error}"),
            GroupError::AlreadyJoined => write!(f, "bad_request: this connection already joined a group"),
            GroupError::UnknownStream { stream } => write!(f, "unknown_stream: no stream named {stream:?}"),
            GroupError::ReplicatedStream { stream } => write!(
                f,
                "replicated_stream: {stream:?} is replicated over the cluster, and consumer groups are kept per \
                 node, not cluster-wide yet; read it with SUB"
            ),
            GroupError::GroupLimit { groups_max } => {
                write!(f, "group_limit: the coordinator shard has {groups_max} groups, its limit")
            }
            GroupError::MemberLimit { members_max } => {
                write!(f, "member_limit: the group has {members_max} members, its limit")
            }
            GroupError::HoldMismatch { group_hold } => {
                let (is, asked) = if *group_hold { ("a hold", "without hold") } else { ("not a hold", "with hold") };
                write!(f, "hold_mismatch: the group is {is} group while it has live members; joined {asked}")
            }
            GroupError::PartitionOutOfRange { partition, partition_count } => {
                write!(f, "partition_out_of_range: partition {partition} >= {partition_count} partitions")
            }
            GroupError::NotAssigned { partition } => {
                write!(f, "not_assigned: partition {partition} is not assigned to this member")
            }
            GroupError::OffsetOutOfRange { partition, next_offset, partition_end } => write!(
                f,
                "offset_out_of_range: commit {next_offset} of partition {partition} is past its end {partition_end}"
            ),
            GroupError::SessionTimeout { session_timeout_ms } => {
                write!(f, "session_timeout: no line from this member for {session_timeout_ms} ms")
            }
            GroupError::RevokeTimeout { revoke_timeout_ms } => {
                write!(f, "revoke_timeout: this member did not read its REVOKED line within {revoke_timeout_ms} ms")
            }
        }
    }
}

impl<'a> From<RequestError<'a>> for GroupError<'a> {
    fn from(error: RequestError<'a>) -> GroupError<'a> {
        GroupError::BadRequest(error)
    }
}

/// A validated partition list from an `ASSIGNED`/`REVOKED` line: strictly
/// ascending `u32`s, so iterating it cannot fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionList<'a> {
    /// The list text, empty for `-`.
    text: &'a [u8],
}

impl<'a> PartitionList<'a> {
    /// Validates a list's text (`-`, or ascending numbers joined by commas).
    pub fn parse(text: &'a [u8]) -> Option<PartitionList<'a>> {
        if text == b"-" {
            return Some(PartitionList { text: b"" });
        }
        let mut previous: Option<u32> = None;
        for entry in text.split(|&byte| byte == b',') {
            let partition = parse_decimal(entry).and_then(|number| u32::try_from(number).ok())?;
            if previous.is_some_and(|previous| previous >= partition) {
                return None;
            }
            previous = Some(partition);
        }
        Some(PartitionList { text })
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The partitions, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        let text = self.text;
        text.split(|&byte| byte == b',')
            .filter(move |_| !text.is_empty())
            .map(|entry| parse_decimal(entry).and_then(|number| u32::try_from(number).ok()).unwrap_or(u32::MAX))
    }
}

/// One line a member reads (without LF), borrowing from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupLine<'a> {
    Assigned {
        generation: u64,
        partitions: PartitionList<'a>,
    },
    Revoked {
        generation: u64,
        partitions: PartitionList<'a>,
    },
    CommitOk {
        partition: u32,
        next_offset: u64,
    },
    /// `ERR <reason>: <detail>` (the detail is empty without `: `).
    Error {
        reason: &'a [u8],
        detail: &'a [u8],
    },
    /// An event, `TRUNCATED` or `CLOSING`, as a `SUB` subscriber reads it.
    Subscriber(SubscriberLine<'a>),
}

/// Parses one line a member received. Event lines go straight to
/// [`parse_subscriber_line`] after a one-byte look at their first digit.
pub fn parse_group_line(line: &[u8]) -> Result<GroupLine<'_>, BadSubscriberLine> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.first().is_some_and(u8::is_ascii_digit) {
        return parse_subscriber_line(line).map(GroupLine::Subscriber);
    }
    let bad = || BadSubscriberLine { line: shown(line) };
    if let Some(rest) = line.strip_prefix(b"ASSIGNED ") {
        let (generation, partitions) = parse_list_line(rest).ok_or_else(bad)?;
        return Ok(GroupLine::Assigned { generation, partitions });
    }
    if let Some(rest) = line.strip_prefix(b"REVOKED ") {
        let (generation, partitions) = parse_list_line(rest).ok_or_else(bad)?;
        return Ok(GroupLine::Revoked { generation, partitions });
    }
    if let Some(rest) = line.strip_prefix(b"OK COMMIT ") {
        let mut numbers = rest.split(|&byte| byte == b' ').map(parse_decimal);
        let (Some(Some(partition)), Some(Some(next_offset)), None) = (numbers.next(), numbers.next(), numbers.next())
        else {
            return Err(bad());
        };
        let partition = u32::try_from(partition).map_err(|_| bad())?;
        return Ok(GroupLine::CommitOk { partition, next_offset });
    }
    if let Some(rest) = line.strip_prefix(b"ERR ") {
        let (reason, detail) = match memchr::memmem::find(rest, b": ") {
            Some(colon) => (&rest[..colon], &rest[colon + 2..]),
            None => (rest, &rest[rest.len()..]),
        };
        return Ok(GroupLine::Error { reason, detail });
    }
    parse_subscriber_line(line).map(GroupLine::Subscriber)
}

fn parse_list_line(rest: &[u8]) -> Option<(u64, PartitionList<'_>)> {
    let space = memchr::memchr(b' ', rest)?;
    let generation = parse_decimal(&rest[..space])?;
    Some((generation, PartitionList::parse(&rest[space + 1..])?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every member line parses into its request, with defaults and options
    /// in either order.
    #[test]
    fn member_lines_parse() {
        let join = |stream, group, reset, hold| GroupRequest::Join(JoinRequest { stream, group, reset, hold });
        assert_eq!(
            parse_group_request(b"GROUP clicks billing"),
            Ok(join("clicks", "billing", OffsetReset::Latest, false))
        );
        assert_eq!(
            parse_group_request(b"GROUP a.b c_d-9 earliest hold\r"),
            Ok(join("a.b", "c_d-9", OffsetReset::Earliest, true))
        );
        assert_eq!(parse_group_request(b"GROUP s g hold latest"), Ok(join("s", "g", OffsetReset::Latest, true)));
        assert_eq!(parse_group_request(b"GROUP  s\tg  hold"), Ok(join("s", "g", OffsetReset::Latest, true)));
        assert_eq!(
            parse_group_request(b"COMMIT 7 18446744073709551615"),
            Ok(GroupRequest::Commit { partition: 7, next_offset: u64::MAX })
        );
        assert_eq!(parse_group_request(b"PING"), Ok(GroupRequest::Ping));
        assert_eq!(parse_group_request(b"LEAVE\r"), Ok(GroupRequest::Leave));
    }

    /// Each kind of bad line gets its own error, naming the field and the
    /// numbers, and the reason is `bad_request`.
    #[test]
    fn bad_member_lines_fail_clearly() {
        use RequestError as E;
        assert_eq!(parse_group_request(b"SUB * earliest"), Err(E::UnknownCommand { command: b"SUB" }));
        assert_eq!(parse_group_request(b""), Err(E::UnknownCommand { command: b"" }));
        let count = |command, argument_count| Err(E::WrongArgumentCount { command, argument_count });
        assert_eq!(parse_group_request(b"GROUP s"), count(GroupCommand::Group, 1));
        assert_eq!(parse_group_request(b"GROUP s g a b c d"), count(GroupCommand::Group, 6));
        assert_eq!(parse_group_request(b"COMMIT 1"), count(GroupCommand::Commit, 1));
        assert_eq!(parse_group_request(b"PING x"), count(GroupCommand::Ping, 1));
        let long = [b"GROUP ".as_slice(), &[b'x'; 65], b" g"].concat();
        assert_eq!(parse_group_request(&long), Err(E::BadName { field: NameField::Stream, name: &long[6..71] }));
        for name in [&b"."[..], b"..", b"Upper", b"a/b", b"\xff"] {
            let line = [b"GROUP s ".as_slice(), name].concat();
            assert_eq!(parse_group_request(&line), Err(E::BadName { field: NameField::Group, name }));
        }
        assert!(is_valid_name(b"...") && is_valid_name(&[b'z'; 64]));
        let number = |field, text| Err(E::BadNumber { field, text });
        assert_eq!(parse_group_request(b"COMMIT 4294967296 0"), number(NumberField::Partition, &b"4294967296"[..]));
        assert_eq!(parse_group_request(b"COMMIT 1 +5"), number(NumberField::NextOffset, &b"+5"[..]));
        assert_eq!(
            parse_group_request(b"COMMIT 1 18446744073709551616"),
            number(NumberField::NextOffset, &b"18446744073709551616"[..])
        );
        assert_eq!(parse_group_request(b"GROUP s g first"), Err(E::UnknownOption { option: b"first" }));
        assert_eq!(parse_group_request(b"GROUP s g latest earliest"), Err(E::RepeatedOption { option: b"earliest" }));
        assert_eq!(parse_group_request(b"GROUP s g hold hold"), Err(E::RepeatedOption { option: b"hold" }));
        let huge = vec![b' '; GROUP_REQUEST_SIZE_MAX + 1];
        assert_eq!(parse_group_request(&huge), Err(E::TooLong { line_size: GROUP_REQUEST_SIZE_MAX + 1 }));
        let error = GroupError::from(parse_group_request(b"COMMIT x 1").unwrap_err());
        assert_eq!(error.reason(), "bad_request");
        assert_eq!(error.to_string(), "bad_request: partition \"x\" is not a decimal u32");
        assert!(!error.closes_connection());
    }

    /// Every line the server writes to a member parses back into what was
    /// written, and the error lines carry their numbers.
    #[test]
    fn server_lines_round_trip() {
        let mut out = Vec::new();
        write_assigned(&mut out, 3, &[0, 5, 4_294_967_295]);
        write_assigned(&mut out, 4, &[]);
        write_revoked(&mut out, 5, &[7]);
        write_commit_ok(&mut out, 2, 120);
        write_group_error(
            &mut out,
            &GroupError::OffsetOutOfRange { partition: 2, next_offset: 130, partition_end: 125 },
        );
        crate::protocol::write_event_line(&mut out, 5, 9, b"k", b"v w");
        let text = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            text,
            "ASSIGNED 3 0,5,4294967295\nASSIGNED 4 -\nREVOKED 5 7\nOK COMMIT 2 120\n\
             ERR offset_out_of_range: commit 130 of partition 2 is past its end 125\n5 9 k v w\n"
        );
        let lines: Vec<GroupLine<'_>> = out
            .split(|&byte| byte == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| parse_group_line(line).unwrap())
            .collect();
        let GroupLine::Assigned { generation: 3, partitions } = lines[0] else { panic!("{:?}", lines[0]) };
        assert_eq!(partitions.iter().collect::<Vec<_>>(), [0, 5, 4_294_967_295]);
        let GroupLine::Assigned { generation: 4, partitions } = lines[1] else { panic!("{:?}", lines[1]) };
        assert!(partitions.is_empty() && partitions.iter().next().is_none());
        let GroupLine::Revoked { generation: 5, partitions } = lines[2] else { panic!("{:?}", lines[2]) };
        assert_eq!(partitions.iter().collect::<Vec<_>>(), [7]);
        assert_eq!(lines[3], GroupLine::CommitOk { partition: 2, next_offset: 120 });
        let GroupLine::Error { reason: b"offset_out_of_range", detail } = lines[4] else { panic!("{:?}", lines[4]) };
        assert!(detail.starts_with(b"commit 130"));
        let event = SubscriberLine::Event { partition: 5, offset: 9, key: b"k", payload: b"v w" };
        assert_eq!(lines[5], GroupLine::Subscriber(event));
        for bad in
            [&b"ASSIGNED 1 3,2"[..], b"ASSIGNED 1 2,2", b"ASSIGNED x 1", b"REVOKED 1", b"ASSIGNED 1 ", b"OK COMMIT 1"]
        {
            assert!(parse_group_line(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// Every error names its reason, and only refused commits and bad lines
    /// keep the connection open.
    #[test]
    fn errors_name_reasons_and_closing() {
        let cases: [(GroupError<'_>, &str, bool); 11] = [
            (GroupError::AlreadyJoined, "bad_request", false),
            (GroupError::UnknownStream { stream: "s" }, "unknown_stream", true),
            (GroupError::ReplicatedStream { stream: "s" }, "replicated_stream", true),
            (GroupError::GroupLimit { groups_max: 4 }, "group_limit", true),
            (GroupError::MemberLimit { members_max: 4 }, "member_limit", true),
            (GroupError::HoldMismatch { group_hold: true }, "hold_mismatch", true),
            (GroupError::PartitionOutOfRange { partition: 9, partition_count: 4 }, "partition_out_of_range", false),
            (GroupError::NotAssigned { partition: 1 }, "not_assigned", false),
            (
                GroupError::OffsetOutOfRange { partition: 1, next_offset: 5, partition_end: 4 },
                "offset_out_of_range",
                false,
            ),
            (GroupError::SessionTimeout { session_timeout_ms: 10_000 }, "session_timeout", true),
            (GroupError::RevokeTimeout { revoke_timeout_ms: 10_000 }, "revoke_timeout", true),
        ];
        for (error, reason, closes) in cases {
            assert_eq!(error.reason(), reason);
            assert_eq!(error.closes_connection(), closes, "{error}");
            let mut out = Vec::new();
            write_group_error(&mut out, &error);
            let GroupLine::Error { reason: parsed, detail } = parse_group_line(&out[..out.len() - 1]).unwrap() else {
                panic!("an error line")
            };
            assert_eq!(parsed, reason.as_bytes());
            assert!(!detail.is_empty());
        }
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        "[a-z0-9._-]{1,64}".prop_filter("not . or ..", |name| name != "." && name != "..")
    }

    proptest! {
        /// Any join or commit a client writes parses back to itself.
        #[test]
        fn requests_round_trip(
            stream in name_strategy(),
            group in name_strategy(),
            earliest in any::<bool>(),
            hold in any::<bool>(),
            partition in any::<u32>(),
            next_offset in any::<u64>(),
        ) {
            let reset = if earliest { OffsetReset::Earliest } else { OffsetReset::Latest };
            let request = JoinRequest { stream: &stream, group: &group, reset, hold };
            let mut out = Vec::new();
            write_join(&mut out, &request);
            write_commit(&mut out, partition, next_offset);
            write_ping(&mut out);
            write_leave(&mut out);
            let lines: Vec<&[u8]> = out.split(|&byte| byte == b'\n').collect();
            prop_assert_eq!(parse_group_request(lines[0]), Ok(GroupRequest::Join(request)));
            prop_assert_eq!(parse_group_request(lines[1]), Ok(GroupRequest::Commit { partition, next_offset }));
            prop_assert_eq!(parse_group_request(lines[2]), Ok(GroupRequest::Ping));
            prop_assert_eq!(parse_group_request(lines[3]), Ok(GroupRequest::Leave));
        }

        /// Any partition list and generation the server writes parses back,
        /// and the line stays within its documented size bound.
        #[test]
        fn partition_lists_round_trip(
            generation in any::<u64>(),
            partitions in proptest::collection::btree_set(any::<u32>(), 0..200),
            revoked in any::<bool>(),
        ) {
            let partitions: Vec<u32> = partitions.into_iter().collect();
            let mut out = Vec::new();
            if revoked { write_revoked(&mut out, generation, &partitions) } else { write_assigned(&mut out, generation, &partitions) }
            let bound = PARTITION_LIST_LINE_OVERHEAD_MAX + partitions.len().max(1) * PARTITION_LIST_ENTRY_SIZE_MAX;
            prop_assert!(out.len() <= bound);
            let (parsed_generation, list) = match parse_group_line(&out[..out.len() - 1]).unwrap() {
                GroupLine::Assigned { generation, partitions } if !revoked => (generation, partitions),
                GroupLine::Revoked { generation, partitions } if revoked => (generation, partitions),
                other => panic!("{other:?}"),
            };
            prop_assert_eq!(parsed_generation, generation);
            prop_assert_eq!(list.iter().collect::<Vec<_>>(), partitions);
        }

        /// Arbitrary bytes never panic either parser, and a list that parses
        /// iterates strictly ascending.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80), prefix in 0usize..6) {
            let prefixes: [&[u8]; 6] = [b"", b"GROUP ", b"COMMIT ", b"ASSIGNED 1 ", b"REVOKED 2 ", b"OK COMMIT "];
            let line = [prefixes[prefix], &bytes].concat();
            let _ = parse_group_request(&line).map_err(|error| GroupError::from(error).to_string());
            if let Ok(GroupLine::Assigned { partitions, .. } | GroupLine::Revoked { partitions, .. }) = parse_group_line(&line) {
                let listed: Vec<u32> = partitions.iter().collect();
                prop_assert!(listed.windows(2).all(|pair| pair[0] < pair[1]));
            }
        }
    }
}
