//! The InfluxDB line protocol (text, v1), as Telegraf and QuestDB's ILP
//! clients send it over TCP.
//!
//! ```text
//! measurement[,tag_key=tag_value...] field_key=field_value[,field_key=field_value...] [timestamp]
//! ```
//!
//! On an ILP listener every line is one event: the **key** is the line's
//! *series key* (its measurement and tag set, in one canonical form) and the
//! **payload** is the line as received (one trailing CR dropped). So a series
//! lands in one partition whatever order a client writes its tags in.
//!
//! # Syntax accepted
//!
//! * **Measurement**: non-empty; `\,` `\ ` and `\\` are escapes, any other
//!   backslash is a literal backslash (as InfluxDB reads it).
//! * **Tags**: optional, `,key=value` each; keys and values non-empty; `\,`
//!   `\=` `\ ` and `\\` are escapes. An unescaped `=` inside a tag value is
//!   taken literally. Two tags with the same key are an error
//!   ([`IlpErrorKind::DuplicateTag`]), as in InfluxDB.
//! * **Fields**: at least one, `key=value` separated by `,`; keys escape like
//!   tag keys. Values: float (`1`, `-1.5`, `1e3`, `.5`; must be finite),
//!   integer `123i` (i64), unsigned `123u` (u64), string `"..."` (`\"` and
//!   `\\` are escapes, any other backslash is literal; commas, spaces and `=`
//!   need no escape inside quotes), boolean `t T true True TRUE f F false
//!   False FALSE`, and QuestDB's extensions: timestamp `123t` (µs) and
//!   long256 `0x1a2bi`. A duplicate field key is allowed; lookups return the
//!   last one.
//! * **Timestamp**: optional, a signed integer in nanoseconds; QuestDB's
//!   protocol-v2 suffixes `n` (ns) and `t` (µs, converted to ns) are accepted.
//! * One or more spaces separate the sections; trailing spaces are allowed.
//!   A line that is empty or only spaces/tabs is ignored.
//! * **Control lines**: a line starting with `#` is a control line (`#SYNC`,
//!   `#PING`, `#STREAM name`), as in the line format. InfluxDB reads `#`
//!   lines as comments; here a comment gets an `unknown_control` reply and is
//!   otherwise harmless. So a measurement cannot start with `#` on this
//!   listener (InfluxDB would read such a line as a comment too).
//!
//! # The series key
//!
//! The measurement, then the tags sorted by key (bytewise, on the unescaped
//! bytes, as InfluxDB sorts them), written with one canonical escaping:
//! measurement `\,` `\ ` `\\`; tag keys `\,` `\=` `\ ` `\\`; tag values `\,`
//! `\ ` `\\` (a value ends at `,` or space, so its `=` stays bare). A line
//! whose series section has no backslash and whose tags are already sorted
//! (what most clients send) is its own canonical form: the key then borrows
//! the line's prefix with no copy. Keys are not capped here; the caller
//! applies its key size limit. Bytes are not checked for UTF-8.
//!
//! `IlpScratch` holds the reused buffers; once they have grown to the
//! longest series seen, parsing allocates nothing. Fields are validated
//! while parsing, and [`Point::fields`], [`Point::field`] and
//! [`Point::timestamp_ns`] give them without re-validating; a stored payload
//! can be read with [`fields`], [`field_value`] and [`timestamp_ns`].
//!
//! # Cost
//!
//! `benches/ilp.rs`, 1000 lines of 116 bytes (`cpu` + 3 tags + 4 fields +
//! timestamp), one run on 2026-12-02 (fastest of 20 windows of 50 ms, load
//! average near 4): tags already sorted 163 ns/line (6.1 M lines/s), tags
//! reversed 270 ns, escaped tags 381 ns; iterating the fields and summing the
//! floats adds ~130 ns. `scripts/bench-formats` counts 3502 instructions per
//! line on the mean of the three corpora (the line format's `parse_line`: 90).
//!
//! ```
//! use spate::protocol::ilp::{FieldValue, IlpLine, IlpScratch, parse_ilp_line};
//! let mut scratch = IlpScratch::default();
//! let line = b"cpu,region=eu,host=a usage=12.5,count=3i 1700000000000000000";
//! let IlpLine::Point(point) = parse_ilp_line(line, &mut scratch).unwrap() else { panic!() };
//! assert_eq!(point.series_key(), b"cpu,host=a,region=eu");
//! assert_eq!(point.field(b"count"), Some(FieldValue::Integer(3)));
//! assert_eq!(point.timestamp_ns(), Some(1_700_000_000_000_000_000));
//! ```

use std::fmt;

/// Bytes a backslash escapes in a measurement.
const MEASUREMENT_SPECIALS: &[u8] = b", \\";
/// Bytes a backslash escapes in tag keys and field keys.
const KEY_SPECIALS: &[u8] = b",= \\";
/// Bytes a backslash escapes in a string field value.
const STRING_SPECIALS: &[u8] = b"\"\\";

/// One parsed ILP line.
#[derive(Debug, PartialEq)]
pub enum IlpLine<'a> {
    /// A point: the event.
    Point(Point<'a>),
    /// A control line, without its leading `#`.
    Control(&'a [u8]),
    /// An empty or blank line: ignored.
    Empty,
}

/// A valid point: its series key, and its fields and timestamp on demand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point<'a> {
    line: &'a [u8],
    series_key: &'a [u8],
    measurement: Escaped<'a>,
    fields: &'a [u8],
    timestamp_ns: Option<i64>,
}

impl<'a> Point<'a> {
    /// Measurement plus sorted tags, canonically escaped: the event key.
    pub fn series_key(&self) -> &'a [u8] {
        self.series_key
    }

    /// The line as received (without a trailing CR): the event payload.
    pub fn payload(&self) -> &'a [u8] {
        self.line
    }

    /// The measurement as written (escaped).
    pub fn measurement(&self) -> Escaped<'a> {
        self.measurement
    }

    /// The fields, in line order (already validated).
    pub fn fields(&self) -> Fields<'a> {
        Fields { section: self.fields, position: 0 }
    }

    /// The value of the last field named `name` (unescaped bytes).
    pub fn field(&self, name: &[u8]) -> Option<FieldValue<'a>> {
        self.fields().filter(|(key, _)| key.unescaped_eq(name)).last().map(|(_, value)| value)
    }

    /// The timestamp in nanoseconds, if the line has one.
    pub fn timestamp_ns(&self) -> Option<i64> {
        self.timestamp_ns
    }
}

/// A field value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValue<'a> {
    Float(f64),
    Integer(i64),
    Unsigned(u64),
    Boolean(bool),
    /// A string, as written between its quotes (escaped).
    String(Escaped<'a>),
    /// QuestDB's `123t`: microseconds since the epoch.
    TimestampMicros(i64),
    /// QuestDB's `0x...i`: the hex digits, without `0x` and `i`.
    Long256(&'a [u8]),
}

/// A name or string as written on the line, with its escapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Escaped<'a> {
    raw: &'a [u8],
    specials: &'static [u8],
}

impl<'a> Escaped<'a> {
    /// The bytes as written.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Whether unescaping changes anything.
    pub fn has_escapes(&self) -> bool {
        memchr::memchr(b'\\', self.raw).is_some()
    }

    /// Appends the unescaped bytes to `out`.
    pub fn unescape_into(&self, out: &mut Vec<u8>) {
        unescape_into(self.raw, self.specials, out);
    }

    /// Whether the unescaped bytes equal `other`, without allocating.
    pub fn unescaped_eq(&self, other: &[u8]) -> bool {
        if !self.has_escapes() {
            return self.raw == other;
        }
        let mut matched = 0;
        let mut equal = true;
        for_each_unescaped(self.raw, self.specials, |chunk| {
            equal &= other.get(matched..matched + chunk.len()) == Some(chunk);
            matched += chunk.len();
        });
        equal && matched == other.len()
    }
}

/// Reused buffers for [`parse_ilp_line`]. Memory: the longest series key
/// seen (twice) plus 40 bytes per tag of the line with the most tags.
#[derive(Debug, Default)]
pub struct IlpScratch {
    key: Vec<u8>,
    unescaped: Vec<u8>,
    tags: Vec<TagSpan>,
}

impl IlpScratch {
    /// Bytes held by the buffers (for memory gauges).
    pub fn capacity_bytes(&self) -> usize {
        self.key.capacity() + self.unescaped.capacity() + self.tags.capacity() * std::mem::size_of::<TagSpan>()
    }
}

/// One tag: byte ranges of its key and value in the line, or in
/// `IlpScratch::unescaped` once unescaped.
#[derive(Debug, Clone, Copy)]
struct TagSpan {
    key_start: usize,
    key_end: usize,
    value_start: usize,
    value_end: usize,
    /// Where the tag starts in the line, for error positions.
    line_position: usize,
}

/// Why a line was rejected: what, and where (byte offset in the line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IlpError {
    pub kind: IlpErrorKind,
    pub byte_position: usize,
}

/// What was wrong with a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IlpErrorKind {
    MeasurementEmpty,
    TagKeyEmpty,
    TagMissingEquals,
    TagValueEmpty,
    DuplicateTag,
    FieldsMissing,
    FieldKeyEmpty,
    FieldMissingEquals,
    FieldValueEmpty,
    BadFieldValue,
    NumberOutOfRange,
    UnterminatedString,
    BadEscape,
    BadTimestamp,
}

impl IlpErrorKind {
    /// A short, stable reason used in `ERR` replies and metric labels.
    pub fn reason(self) -> &'static str {
        match self {
            IlpErrorKind::MeasurementEmpty => "measurement_empty",
            IlpErrorKind::TagKeyEmpty => "tag_key_empty",
            IlpErrorKind::TagMissingEquals => "tag_missing_equals",
            IlpErrorKind::TagValueEmpty => "tag_value_empty",
            IlpErrorKind::DuplicateTag => "duplicate_tag",
            IlpErrorKind::FieldsMissing => "fields_missing",
            IlpErrorKind::FieldKeyEmpty => "field_key_empty",
            IlpErrorKind::FieldMissingEquals => "field_missing_equals",
            IlpErrorKind::FieldValueEmpty => "field_value_empty",
            IlpErrorKind::BadFieldValue => "bad_field_value",
            IlpErrorKind::NumberOutOfRange => "number_out_of_range",
            IlpErrorKind::UnterminatedString => "unterminated_string",
            IlpErrorKind::BadEscape => "bad_escape",
            IlpErrorKind::BadTimestamp => "bad_timestamp",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            IlpErrorKind::MeasurementEmpty => "the line has no measurement",
            IlpErrorKind::TagKeyEmpty => "a tag has an empty key",
            IlpErrorKind::TagMissingEquals => "a tag has no '='",
            IlpErrorKind::TagValueEmpty => "a tag has an empty value",
            IlpErrorKind::DuplicateTag => "a tag key appears twice",
            IlpErrorKind::FieldsMissing => "the line has no field set",
            IlpErrorKind::FieldKeyEmpty => "a field has an empty key",
            IlpErrorKind::FieldMissingEquals => "a field has no '='",
            IlpErrorKind::FieldValueEmpty => "a field has no value",
            IlpErrorKind::BadFieldValue => "a field value is not a float, integer, string or boolean",
            IlpErrorKind::NumberOutOfRange => "a number is out of range for its type",
            IlpErrorKind::UnterminatedString => "a string field value has no closing quote",
            IlpErrorKind::BadEscape => "a backslash ends the line",
            IlpErrorKind::BadTimestamp => "the timestamp is not an integer (ns, or with an n/t suffix)",
        }
    }
}

impl IlpError {
    fn at(kind: IlpErrorKind, byte_position: usize) -> IlpError {
        IlpError { kind, byte_position }
    }

    /// A short, stable reason used in `ERR` replies and metric labels.
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }
}

impl fmt::Display for IlpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} at byte {}", self.kind.reason(), self.kind.describe(), self.byte_position)
    }
}

impl std::error::Error for IlpError {}

/// Parses one line (without its LF; a trailing CR is dropped): a point, a
/// control line or an empty line. The series key is written into `scratch`
/// (or borrowed from the line when it already is canonical).
pub fn parse_ilp_line<'a>(line: &'a [u8], scratch: &'a mut IlpScratch) -> Result<IlpLine<'a>, IlpError> {
    let line = match line.last() {
        Some(b'\r') => &line[..line.len() - 1],
        _ => line,
    };
    match line.first() {
        None => Ok(IlpLine::Empty),
        Some(b'#') => Ok(IlpLine::Control(&line[1..])),
        Some(_) if line.iter().all(|&byte| byte == b' ' || byte == b'\t') => Ok(IlpLine::Empty),
        Some(_) => parse_point(line, scratch).map(IlpLine::Point),
    }
}

/// Parses one point (no CR handling, no control lines).
pub fn parse_point<'a>(line: &'a [u8], scratch: &'a mut IlpScratch) -> Result<Point<'a>, IlpError> {
    scratch.tags.clear();
    let series = scan_series(line, &mut scratch.tags)?;
    let fields_start = skip_spaces(line, series.end);
    if fields_start == line.len() {
        return Err(IlpError::at(IlpErrorKind::FieldsMissing, fields_start));
    }
    let fields_end = validate_fields(line, fields_start)?;
    let timestamp_ns = parse_timestamp(line, fields_end)?;
    let series_key = canonical_key(line, &series, scratch)?;
    Ok(Point {
        line,
        series_key,
        measurement: Escaped { raw: &line[..series.measurement_end], specials: MEASUREMENT_SPECIALS },
        fields: &line[fields_start..fields_end],
        timestamp_ns,
    })
}

/// Where the series section (measurement and tags) ends.
struct Series {
    measurement_end: usize,
    /// The first byte after the series section (a space, or the line's end).
    end: usize,
    has_escapes: bool,
}

/// Scans `measurement[,k=v...]` up to its unescaped space, recording tags.
fn scan_series(line: &[u8], tags: &mut Vec<TagSpan>) -> Result<Series, IlpError> {
    let mut has_escapes = false;
    let measurement_end = scan_name(line, 0, &STOPS_COMMA_SPACE, &mut has_escapes)?;
    if measurement_end == 0 {
        return Err(IlpError::at(IlpErrorKind::MeasurementEmpty, 0));
    }
    let mut position = measurement_end;
    while line.get(position) == Some(&b',') {
        let key_start = position + 1;
        let key_end = scan_name(line, key_start, &STOPS_COMMA_EQUALS_SPACE, &mut has_escapes)?;
        if key_end == key_start {
            return Err(IlpError::at(IlpErrorKind::TagKeyEmpty, key_start));
        }
        if line.get(key_end) != Some(&b'=') {
            return Err(IlpError::at(IlpErrorKind::TagMissingEquals, key_end));
        }
        let value_start = key_end + 1;
        let value_end = scan_name(line, value_start, &STOPS_COMMA_SPACE, &mut has_escapes)?;
        if value_end == value_start {
            return Err(IlpError::at(IlpErrorKind::TagValueEmpty, value_start));
        }
        tags.push(TagSpan { key_start, key_end, value_start, value_end, line_position: position });
        position = value_end;
    }
    Ok(Series { measurement_end, end: position, has_escapes })
}

/// A byte class table for [`scan_name`]: `STOP` ends the name, `ESCAPE` is
/// the backslash, anything else (0) is part of the name.
type StopTable = [u8; 256];
const STOP: u8 = 1;
const ESCAPE: u8 = 2;

const fn stop_table(stops: &[u8]) -> StopTable {
    let mut table = [0u8; 256];
    let mut index = 0;
    while index < stops.len() {
        table[stops[index] as usize] = STOP;
        index += 1;
    }
    table[b'\\' as usize] = ESCAPE;
    table
}

/// Measurement and tag values end at `,` or space.
static STOPS_COMMA_SPACE: StopTable = stop_table(b", ");
/// Tag keys and field keys end at `,`, `=` or space.
static STOPS_COMMA_EQUALS_SPACE: StopTable = stop_table(b",= ");
/// The whole series section ends at a space.
static STOPS_SPACE: StopTable = stop_table(b" ");

/// Scans a name from `start` to the first unescaped stop byte (or the
/// line's end). A backslash escapes the byte after it.
#[inline]
fn scan_name(line: &[u8], start: usize, stops: &StopTable, has_escapes: &mut bool) -> Result<usize, IlpError> {
    let mut position = start;
    while let Some(&byte) = line.get(position) {
        match stops[usize::from(byte)] {
            0 => position += 1,
            STOP => break,
            _ => {
                if position + 1 == line.len() {
                    return Err(IlpError::at(IlpErrorKind::BadEscape, position));
                }
                *has_escapes = true;
                position += 2;
            }
        }
    }
    Ok(position)
}

fn skip_spaces(line: &[u8], mut position: usize) -> usize {
    while line.get(position) == Some(&b' ') {
        position += 1;
    }
    position
}

/// Sorts the tags, rejects duplicates and returns the canonical series key:
/// the line's own prefix when it already is canonical, else written into
/// `scratch.key`.
fn canonical_key<'a>(line: &'a [u8], series: &Series, scratch: &'a mut IlpScratch) -> Result<&'a [u8], IlpError> {
    let IlpScratch { key, unescaped, tags } = scratch;
    let (source, measurement_end): (&[u8], usize) = if series.has_escapes {
        let measurement_end = unescape_series(line, series.measurement_end, tags, unescaped);
        (unescaped, measurement_end)
    } else {
        (line, series.measurement_end)
    };
    let tag_key = |tag: &TagSpan| &source[tag.key_start..tag.key_end];
    if !series.has_escapes && tags.windows(2).all(|pair| tag_key(&pair[0]) < tag_key(&pair[1])) {
        return Ok(&line[..series.end]);
    }
    tags.sort_unstable_by(|left, right| tag_key(left).cmp(tag_key(right)));
    if let Some(pair) = tags.windows(2).find(|pair| tag_key(&pair[0]) == tag_key(&pair[1])) {
        let position = pair[0].line_position.max(pair[1].line_position);
        return Err(IlpError::at(IlpErrorKind::DuplicateTag, position));
    }
    key.clear();
    escape_into(&source[..measurement_end], &STOPS_COMMA_SPACE, key);
    for tag in tags.iter() {
        key.push(b',');
        escape_into(&source[tag.key_start..tag.key_end], &STOPS_COMMA_EQUALS_SPACE, key);
        key.push(b'=');
        escape_into(&source[tag.value_start..tag.value_end], &STOPS_COMMA_SPACE, key);
    }
    Ok(&key[..])
}

/// Unescapes the measurement and every tag into `out` (measurement first,
/// then each key and value), points the spans there and returns where the
/// unescaped measurement ends.
fn unescape_series(line: &[u8], measurement_end: usize, tags: &mut [TagSpan], out: &mut Vec<u8>) -> usize {
    out.clear();
    unescape_into(&line[..measurement_end], MEASUREMENT_SPECIALS, out);
    let unescaped_measurement_end = out.len();
    for tag in tags.iter_mut() {
        let key_start = out.len();
        unescape_into(&line[tag.key_start..tag.key_end], KEY_SPECIALS, out);
        let value_start = out.len();
        unescape_into(&line[tag.value_start..tag.value_end], KEY_SPECIALS, out);
        *tag = TagSpan { key_start, key_end: value_start, value_start, value_end: out.len(), ..*tag };
    }
    unescaped_measurement_end
}

/// Calls `chunk` with the unescaped bytes of `raw`, in pieces.
fn for_each_unescaped(raw: &[u8], specials: &[u8], mut chunk: impl FnMut(&[u8])) {
    let mut position = 0;
    while let Some(offset) = memchr::memchr(b'\\', &raw[position..]) {
        let backslash = position + offset;
        match raw.get(backslash + 1) {
            Some(next) if specials.contains(next) => {
                chunk(&raw[position..backslash]);
                chunk(std::slice::from_ref(next));
                position = backslash + 2;
            }
            // Not an escape: the backslash is literal.
            _ => {
                chunk(&raw[position..backslash + 1]);
                position = backslash + 1;
            }
        }
    }
    chunk(&raw[position..]);
}

fn unescape_into(raw: &[u8], specials: &[u8], out: &mut Vec<u8>) {
    for_each_unescaped(raw, specials, |chunk| out.extend_from_slice(chunk));
}

/// Appends `bytes` with a backslash before each byte that `escapes` marks
/// (its stop bytes and the backslash).
#[inline]
fn escape_into(bytes: &[u8], escapes: &StopTable, out: &mut Vec<u8>) {
    let mut run_start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        if escapes[usize::from(byte)] != 0 {
            out.extend_from_slice(&bytes[run_start..index]);
            out.push(b'\\');
            run_start = index;
        }
    }
    out.extend_from_slice(&bytes[run_start..]);
}

/// Validates the field set starting at `start`; returns where it ends.
fn validate_fields(line: &[u8], start: usize) -> Result<usize, IlpError> {
    let mut position = start;
    loop {
        let (_, _, end) = scan_field(line, position)?;
        match line.get(end) {
            Some(b',') => position = end + 1,
            _ => return Ok(end),
        }
    }
}

/// Scans one `key=value` at `start`: the key, the value and where it ends
/// (at `,`, a space or the line's end).
fn scan_field(line: &[u8], start: usize) -> Result<(Escaped<'_>, FieldValue<'_>, usize), IlpError> {
    let mut has_escapes = false;
    let key_end = scan_name(line, start, &STOPS_COMMA_EQUALS_SPACE, &mut has_escapes)?;
    if key_end == start {
        return Err(IlpError::at(IlpErrorKind::FieldKeyEmpty, start));
    }
    if line.get(key_end) != Some(&b'=') {
        return Err(IlpError::at(IlpErrorKind::FieldMissingEquals, key_end));
    }
    let key = Escaped { raw: &line[start..key_end], specials: KEY_SPECIALS };
    let value_start = key_end + 1;
    let (value, end) = match line.get(value_start) {
        None | Some(b',' | b' ') => return Err(IlpError::at(IlpErrorKind::FieldValueEmpty, value_start)),
        Some(b'"') => scan_string(line, value_start)?,
        Some(_) => {
            let end = value_end(line, value_start);
            (classify_value(&line[value_start..end], value_start)?, end)
        }
    };
    match line.get(end) {
        None | Some(b',' | b' ') => Ok((key, value, end)),
        Some(_) => Err(IlpError::at(IlpErrorKind::BadFieldValue, end)),
    }
}

/// Scans a quoted string value (`start` at its opening quote).
fn scan_string(line: &[u8], start: usize) -> Result<(FieldValue<'_>, usize), IlpError> {
    let mut position = start + 1;
    loop {
        match memchr::memchr2(b'"', b'\\', &line[position..]) {
            None => return Err(IlpError::at(IlpErrorKind::UnterminatedString, start)),
            Some(offset) if line[position + offset] == b'"' => {
                let end = position + offset;
                let raw = &line[start + 1..end];
                return Ok((FieldValue::String(Escaped { raw, specials: STRING_SPECIALS }), end + 1));
            }
            // A backslash: the byte after it is taken whatever it is.
            Some(offset) => position = (position + offset + 2).min(line.len()),
        }
    }
}

/// Reads an unquoted field value.
fn classify_value(text: &[u8], position: usize) -> Result<FieldValue<'_>, IlpError> {
    let bad = |kind| IlpError::at(kind, position);
    match text {
        b"t" | b"T" | b"true" | b"True" | b"TRUE" => return Ok(FieldValue::Boolean(true)),
        b"f" | b"F" | b"false" | b"False" | b"FALSE" => return Ok(FieldValue::Boolean(false)),
        _ => {}
    }
    let (body, suffix) = text.split_at(text.len() - 1);
    match suffix[0] {
        b'i' if body.starts_with(b"0x") => {
            let digits = &body[2..];
            let valid = (1..=64).contains(&digits.len()) && digits.iter().all(u8::is_ascii_hexdigit);
            if valid { Ok(FieldValue::Long256(digits)) } else { Err(bad(IlpErrorKind::BadFieldValue)) }
        }
        b'i' => parse_signed(body).map(FieldValue::Integer).map_err(bad),
        b'u' => parse_unsigned(body).map(FieldValue::Unsigned).map_err(bad),
        b't' => parse_signed(body).map(FieldValue::TimestampMicros).map_err(bad),
        _ => parse_float(text).map(FieldValue::Float).map_err(bad),
    }
}

/// `[0-9]+` as a u64.
fn parse_unsigned(digits: &[u8]) -> Result<u64, IlpErrorKind> {
    if digits.is_empty() {
        return Err(IlpErrorKind::BadFieldValue);
    }
    let mut value = 0u64;
    // Up to 19 digits cannot overflow (10^19 - 1 < 2^64): only longer
    // numbers pay for checked arithmetic.
    let unchecked_count = digits.len().min(19);
    for &byte in &digits[..unchecked_count] {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return Err(IlpErrorKind::BadFieldValue);
        }
        value = value * 10 + u64::from(digit);
    }
    let mut overflow = false;
    for &byte in &digits[unchecked_count..] {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return Err(IlpErrorKind::BadFieldValue);
        }
        match value.checked_mul(10).and_then(|value| value.checked_add(u64::from(digit))) {
            Some(next) => value = next,
            None => overflow = true,
        }
    }
    if overflow { Err(IlpErrorKind::NumberOutOfRange) } else { Ok(value) }
}

/// The first `,` or space at or after `start`, or the line's end. A plain
/// loop: values are short, and a memchr call costs more than it saves.
#[inline]
fn value_end(line: &[u8], start: usize) -> usize {
    let mut position = start;
    while position < line.len() && STOPS_COMMA_SPACE[usize::from(line[position])] != STOP {
        position += 1;
    }
    position
}

/// `-?[0-9]+` as an i64 (the full range, `i64::MIN` included).
fn parse_signed(text: &[u8]) -> Result<i64, IlpErrorKind> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    let magnitude = parse_unsigned(digits)?;
    if negative {
        0i64.checked_sub_unsigned(magnitude).ok_or(IlpErrorKind::NumberOutOfRange)
    } else {
        i64::try_from(magnitude).map_err(|_| IlpErrorKind::NumberOutOfRange)
    }
}

/// `[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?`, finite.
fn parse_float(text: &[u8]) -> Result<f64, IlpErrorKind> {
    if let Some(value) = simple_decimal(text) {
        return Ok(value);
    }
    let mut position = usize::from(matches!(text.first(), Some(b'+' | b'-')));
    let integer_digits = count_digits(text, position);
    position += integer_digits;
    let mut fraction_digits = 0;
    if text.get(position) == Some(&b'.') {
        fraction_digits = count_digits(text, position + 1);
        position += 1 + fraction_digits;
    }
    if integer_digits + fraction_digits == 0 {
        return Err(IlpErrorKind::BadFieldValue);
    }
    if matches!(text.get(position), Some(b'e' | b'E')) {
        position += 1 + usize::from(matches!(text.get(position + 1), Some(b'+' | b'-')));
        let exponent_digits = count_digits(text, position);
        if exponent_digits == 0 {
            return Err(IlpErrorKind::BadFieldValue);
        }
        position += exponent_digits;
    }
    if position != text.len() {
        return Err(IlpErrorKind::BadFieldValue);
    }
    // The grammar above is a subset of what `f64::from_str` accepts.
    let value: f64 =
        std::str::from_utf8(text).ok().and_then(|text| text.parse().ok()).ok_or(IlpErrorKind::BadFieldValue)?;
    if value.is_finite() { Ok(value) } else { Err(IlpErrorKind::NumberOutOfRange) }
}

/// Exact powers of ten an f64 holds (10^22 is the largest).
const POWERS_OF_TEN: [f64; 16] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];

/// The common case without `f64::from_str`: `-?digits[.digits]`, no
/// exponent, at most 15 digits in all. The mantissa and the power of ten are
/// then both exact f64s, and one IEEE division rounds correctly (Clinger's
/// fast path), so the result is the same as `from_str`'s.
fn simple_decimal(text: &[u8]) -> Option<f64> {
    let (negative, body) = match text.split_first() {
        Some((b'-', body)) => (true, body),
        Some((b'+', body)) => (false, body),
        _ => (false, text),
    };
    if body.len() > 16 {
        return None;
    }
    let (mut mantissa, mut digit_count, mut fraction_digits, mut seen_point) = (0u64, 0usize, 0usize, false);
    for &byte in body {
        match byte {
            b'0'..=b'9' => {
                mantissa = mantissa * 10 + u64::from(byte - b'0');
                digit_count += 1;
                fraction_digits += usize::from(seen_point);
            }
            b'.' if !seen_point => seen_point = true,
            _ => return None,
        }
    }
    if digit_count == 0 || digit_count > 15 {
        return None;
    }
    let value = mantissa as f64 / POWERS_OF_TEN[fraction_digits];
    Some(if negative { -value } else { value })
}

fn count_digits(text: &[u8], start: usize) -> usize {
    text.get(start..).map_or(0, |rest| rest.iter().take_while(|byte| byte.is_ascii_digit()).count())
}

/// Parses the optional timestamp after the field set (at `start`).
fn parse_timestamp(line: &[u8], start: usize) -> Result<Option<i64>, IlpError> {
    let position = skip_spaces(line, start);
    if position == line.len() {
        return Ok(None);
    }
    let mut end = position;
    while end < line.len() && line[end] != b' ' {
        end += 1;
    }
    if skip_spaces(line, end) != line.len() {
        return Err(IlpError::at(IlpErrorKind::BadTimestamp, end));
    }
    let text = &line[position..end];
    let bad = |kind| match kind {
        IlpErrorKind::NumberOutOfRange => IlpError::at(kind, position),
        _ => IlpError::at(IlpErrorKind::BadTimestamp, position),
    };
    let timestamp_ns = match text.split_last() {
        Some((b'n', digits)) => parse_signed(digits).map_err(bad)?,
        Some((b't', digits)) => {
            let micros = parse_signed(digits).map_err(bad)?;
            micros.checked_mul(1000).ok_or(bad(IlpErrorKind::NumberOutOfRange))?
        }
        _ => parse_signed(text).map_err(bad)?,
    };
    Ok(Some(timestamp_ns))
}

/// The fields of a point, in line order.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    section: &'a [u8],
    position: usize,
}

impl<'a> Iterator for Fields<'a> {
    type Item = (Escaped<'a>, FieldValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.position >= self.section.len() {
            return None;
        }
        match scan_field(self.section, self.position) {
            Ok((key, value, end)) => {
                self.position = end + 1;
                Some((key, value))
            }
            // Only reachable on a payload that was never validated.
            Err(_) => {
                self.position = self.section.len();
                None
            }
        }
    }
}

/// The field section and the timestamp text of a (validated) line.
fn locate_sections(line: &[u8]) -> (&[u8], &[u8]) {
    let mut has_escapes = false;
    let series_end = scan_name(line, 0, &STOPS_SPACE, &mut has_escapes).unwrap_or(line.len());
    let fields_start = skip_spaces(line, series_end);
    let mut position = fields_start;
    loop {
        match scan_field(line, position) {
            Ok((_, _, end)) if line.get(end) == Some(&b',') => position = end + 1,
            Ok((_, _, end)) => return (&line[fields_start..end], &line[end..]),
            Err(_) => return (&[], &[]),
        }
    }
}

/// The fields of a stored payload (a line [`parse_point`] accepted).
pub fn fields(line: &[u8]) -> Fields<'_> {
    Fields { section: locate_sections(line).0, position: 0 }
}

/// The value of the last field named `name` in a stored payload.
pub fn field_value<'a>(line: &'a [u8], name: &[u8]) -> Option<FieldValue<'a>> {
    fields(line).filter(|(key, _)| key.unescaped_eq(name)).last().map(|(_, value)| value)
}

/// The timestamp of a stored payload, in nanoseconds, if it has one.
pub fn timestamp_ns(line: &[u8]) -> Option<i64> {
    let (_, rest) = locate_sections(line);
    parse_timestamp(rest, 0).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parsed point, owned: series key, `(raw field key, value as Debug)`, timestamp.
    type Parsed = (Vec<u8>, Vec<(Vec<u8>, String)>, Option<i64>);

    fn point(line: &str) -> Result<Parsed, IlpError> {
        let mut scratch = IlpScratch::default();
        let point = parse_point(line.as_bytes(), &mut scratch)?;
        let fields = point.fields().map(|(key, value)| (key.raw().to_vec(), format!("{value:?}"))).collect();
        Ok((point.series_key().to_vec(), fields, point.timestamp_ns()))
    }

    fn series_key(line: &str) -> String {
        String::from_utf8(point(line).unwrap_or_else(|error| panic!("{line}: {error}")).0).unwrap()
    }

    fn error(line: &str) -> (IlpErrorKind, usize) {
        let error = point(line).expect_err(line);
        (error.kind, error.byte_position)
    }

    /// Tags are sorted by key into the series key, whatever order they came in.
    #[test]
    fn series_key_sorts_tags() {
        assert_eq!(series_key("cpu usage=1"), "cpu");
        assert_eq!(series_key("cpu,host=a,region=eu usage=1"), "cpu,host=a,region=eu");
        assert_eq!(series_key("cpu,region=eu,host=a usage=1"), "cpu,host=a,region=eu");
        assert_eq!(series_key("cpu,b=2,c=3,a=1 x=1i 5"), "cpu,a=1,b=2,c=3");
        assert_eq!(series_key("cpu,AB=1,Aa=2 x=1"), "cpu,AB=1,Aa=2");
    }

    /// An already-canonical line lends its prefix as the key, with no copy.
    #[test]
    fn canonical_lines_are_borrowed() {
        let mut scratch = IlpScratch::default();
        let line = b"cpu,host=a,region=eu usage=1";
        let point = parse_point(line, &mut scratch).unwrap();
        assert_eq!(point.series_key().as_ptr(), line.as_ptr());
        assert_eq!(point.payload(), line);
    }

    /// Escapes are unescaped, then written back in one canonical form, so
    /// equivalent spellings give one key.
    #[test]
    fn escapes_are_canonical() {
        assert_eq!(series_key(r"my\ cpu,h\=x=a\,b\ c usage=1"), r"my\ cpu,h\=x=a\,b\ c");
        assert_eq!(series_key(r"cpu,k=a\=b x=1"), "cpu,k=a=b");
        assert_eq!(series_key("cpu,k=a=b x=1"), "cpu,k=a=b");
        assert_eq!(series_key(r"c\pu,k=v x=1"), r"c\\pu,k=v");
        assert_eq!(series_key(r"c\\pu,k=v x=1"), r"c\\pu,k=v");
        assert_eq!(series_key(r"cpu,z=1,a\ b=2 x=1"), r"cpu,a\ b=2,z=1");
        assert_eq!(series_key(r"m\=,k=v x=1"), r"m\\=,k=v");
    }

    /// Every field type of InfluxDB's and QuestDB's v1 text protocol parses.
    #[test]
    fn field_values_of_every_type() {
        let mut scratch = IlpScratch::default();
        let line = br#"m f=1.5,n=-2e3,i=-9223372036854775808i,u=18446744073709551615u,s="a \"q\" \\ b, c=d",b=T,bb=false,ts=1700t,l=0xFFi,dot=.5"#;
        let point = parse_point(line, &mut scratch).unwrap();
        assert_eq!(point.field(b"f"), Some(FieldValue::Float(1.5)));
        assert_eq!(point.field(b"n"), Some(FieldValue::Float(-2000.0)));
        assert_eq!(point.field(b"i"), Some(FieldValue::Integer(i64::MIN)));
        assert_eq!(point.field(b"u"), Some(FieldValue::Unsigned(u64::MAX)));
        let Some(FieldValue::String(text)) = point.field(b"s") else { panic!() };
        let mut unescaped = Vec::new();
        text.unescape_into(&mut unescaped);
        assert_eq!(unescaped, br#"a "q" \ b, c=d"#);
        assert_eq!(point.field(b"b"), Some(FieldValue::Boolean(true)));
        assert_eq!(point.field(b"bb"), Some(FieldValue::Boolean(false)));
        assert_eq!(point.field(b"ts"), Some(FieldValue::TimestampMicros(1700)));
        assert_eq!(point.field(b"l"), Some(FieldValue::Long256(b"FF")));
        assert_eq!(point.field(b"dot"), Some(FieldValue::Float(0.5)));
        assert_eq!(point.field(b"absent"), None);
        assert_eq!(point.fields().count(), 10);
        assert_eq!(point.timestamp_ns(), None);
    }

    /// Timestamps: plain ns, `n` and `t` suffixes, extra spaces, none.
    #[test]
    fn timestamps() {
        assert_eq!(point("m x=1 1700000000000000000").unwrap().2, Some(1_700_000_000_000_000_000));
        assert_eq!(point("m x=1 -5").unwrap().2, Some(-5));
        assert_eq!(point("m x=1 12n").unwrap().2, Some(12));
        assert_eq!(point("m x=1 12t").unwrap().2, Some(12_000));
        assert_eq!(point("m  x=1  7  ").unwrap().2, Some(7));
        assert_eq!(point("m x=1 ").unwrap().2, None);
        assert_eq!(error("m x=1 12x"), (IlpErrorKind::BadTimestamp, 6));
        assert_eq!(error("m x=1 1 2"), (IlpErrorKind::BadTimestamp, 7));
        assert_eq!(error("m x=1 99999999999999999999"), (IlpErrorKind::NumberOutOfRange, 6));
    }

    /// Malformed lines are rejected with what and where.
    #[test]
    fn malformed_lines_are_rejected_with_a_position() {
        assert_eq!(error(",t=1 x=1"), (IlpErrorKind::MeasurementEmpty, 0));
        assert_eq!(error(" x=1"), (IlpErrorKind::MeasurementEmpty, 0));
        assert_eq!(error("m"), (IlpErrorKind::FieldsMissing, 1));
        assert_eq!(error("m,t=1"), (IlpErrorKind::FieldsMissing, 5));
        assert_eq!(error("m,=1 x=1"), (IlpErrorKind::TagKeyEmpty, 2));
        assert_eq!(error("m,t x=1"), (IlpErrorKind::TagMissingEquals, 3));
        assert_eq!(error("m,t= x=1"), (IlpErrorKind::TagValueEmpty, 4));
        assert_eq!(error("m,a=1,b=2,a=3 x=1"), (IlpErrorKind::DuplicateTag, 9));
        assert_eq!(error(r"m,a\ b=1,a\ b=2 x=1"), (IlpErrorKind::DuplicateTag, 8));
        assert_eq!(series_key(r"m,a=1,\a=3 x=1"), r"m,\\a=3,a=1");
        assert_eq!(error("m =1"), (IlpErrorKind::FieldKeyEmpty, 2));
        assert_eq!(error("m x"), (IlpErrorKind::FieldMissingEquals, 3));
        assert_eq!(error("m x=1,y"), (IlpErrorKind::FieldMissingEquals, 7));
        assert_eq!(error("m x="), (IlpErrorKind::FieldValueEmpty, 4));
        assert_eq!(error("m x=,y=1"), (IlpErrorKind::FieldValueEmpty, 4));
        assert_eq!(error("m x=1,"), (IlpErrorKind::FieldKeyEmpty, 6));
        assert_eq!(error("m x=abc"), (IlpErrorKind::BadFieldValue, 4));
        assert_eq!(error("m x=1.2.3"), (IlpErrorKind::BadFieldValue, 4));
        assert_eq!(error("m x=1e"), (IlpErrorKind::BadFieldValue, 4));
        assert_eq!(error("m x=1.5i"), (IlpErrorKind::BadFieldValue, 4));
        assert_eq!(error("m x=-1u"), (IlpErrorKind::BadFieldValue, 4));
        assert_eq!(error("m x=0xi"), (IlpErrorKind::BadFieldValue, 4));
        assert_eq!(error("m x=9223372036854775808i"), (IlpErrorKind::NumberOutOfRange, 4));
        assert_eq!(error("m x=18446744073709551616u"), (IlpErrorKind::NumberOutOfRange, 4));
        assert_eq!(error("m x=1e999"), (IlpErrorKind::NumberOutOfRange, 4));
        assert_eq!(error(r#"m x="abc"#), (IlpErrorKind::UnterminatedString, 4));
        assert_eq!(error(r#"m x="abc\""#), (IlpErrorKind::UnterminatedString, 4));
        assert_eq!(error(r#"m x="a"b"#), (IlpErrorKind::BadFieldValue, 7));
        assert_eq!(error("m\\"), (IlpErrorKind::BadEscape, 1));
        assert_eq!(error("m x\\"), (IlpErrorKind::BadEscape, 3));
    }

    /// The float fast path gives exactly what `f64::from_str` gives.
    #[test]
    fn simple_decimals_match_from_str() {
        for text in [
            "0",
            "-0",
            "1.5",
            "12.50",
            ".5",
            "5.",
            "+3.25",
            "123456789012345",
            "0.1",
            "-9.87654321",
            "1.000000000000001",
        ] {
            let expected: f64 = text.parse().unwrap();
            assert_eq!(parse_float(text.as_bytes()).unwrap().to_bits(), expected.to_bits(), "{text}");
        }
        assert_eq!(simple_decimal(b"1e3"), None);
        assert_eq!(simple_decimal(b"1234567890123456"), None);
    }

    /// The ERR detail: reason first, then what and where.
    #[test]
    fn errors_display_reason_and_position() {
        let error = point("m,t x=1").unwrap_err();
        assert_eq!(error.to_string(), "tag_missing_equals: a tag has no '=' at byte 3");
        assert_eq!(error.reason(), "tag_missing_equals");
    }

    /// Control, empty and blank lines are classified; CR is dropped.
    #[test]
    fn control_and_empty_lines() {
        let mut scratch = IlpScratch::default();
        assert_eq!(parse_ilp_line(b"#SYNC t", &mut scratch), Ok(IlpLine::Control(b"SYNC t")));
        assert_eq!(parse_ilp_line(b"", &mut scratch), Ok(IlpLine::Empty));
        assert_eq!(parse_ilp_line(b" \t \r", &mut scratch), Ok(IlpLine::Empty));
        let IlpLine::Point(point) = parse_ilp_line(b"m x=1\r", &mut scratch).unwrap() else { panic!() };
        assert_eq!(point.payload(), b"m x=1");
    }

    /// Stored payloads give their fields and timestamp without a scratch;
    /// escaped field keys match their unescaped names.
    #[test]
    fn stored_payload_accessors() {
        let line = br#"cpu,host=a\ b usage=12.5,s="x y",c\,d=2i,usage=13 99"#;
        assert_eq!(field_value(line, b"usage"), Some(FieldValue::Float(13.0)));
        assert_eq!(field_value(line, b"c,d"), Some(FieldValue::Integer(2)));
        assert_eq!(field_value(line, b"c\\,d"), None);
        assert_eq!(timestamp_ns(line), Some(99));
        assert_eq!(fields(line).count(), 4);
        assert_eq!(timestamp_ns(b"m x=1"), None);
        assert_eq!(fields(b"garbage").count(), 0);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn name() -> impl Strategy<Value = String> {
            "[a-c ,=\\\\\"é]{1,4}"
        }

        /// A line with the given tags, escaped as a client would.
        fn render(measurement: &str, tags: &[(String, String)]) -> Vec<u8> {
            let mut line = Vec::new();
            escape_into(measurement.as_bytes(), &STOPS_COMMA_SPACE, &mut line);
            for (key, value) in tags {
                line.push(b',');
                escape_into(key.as_bytes(), &STOPS_COMMA_EQUALS_SPACE, &mut line);
                line.push(b'=');
                escape_into(value.as_bytes(), &STOPS_COMMA_EQUALS_SPACE, &mut line);
            }
            line.extend_from_slice(br#" v=1i,s="x" 1"#);
            line
        }

        proptest! {
            /// The series key is invariant under tag permutation, and it is
            /// the measurement and tags sorted by unescaped key.
            #[test]
            fn series_key_is_invariant_under_tag_permutation(
                measurement in name(),
                tags in prop::collection::btree_map(name(), name(), 0..6),
                seed in any::<u64>(),
            ) {
                let sorted: Vec<(String, String)> = tags.into_iter().collect();
                let mut shuffled = sorted.clone();
                let mut state = seed;
                for index in (1..shuffled.len()).rev() {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    shuffled.swap(index, (state >> 33) as usize % (index + 1));
                }
                let mut scratch = IlpScratch::default();
                let expected = {
                    let mut key = Vec::new();
                    escape_into(measurement.as_bytes(), &STOPS_COMMA_SPACE, &mut key);
                    for (tag_key, value) in &sorted {
                        key.push(b',');
                        escape_into(tag_key.as_bytes(), &STOPS_COMMA_EQUALS_SPACE, &mut key);
                        key.push(b'=');
                        escape_into(value.as_bytes(), &STOPS_COMMA_SPACE, &mut key);
                    }
                    key
                };
                let line = render(&measurement, &shuffled);
                let point = parse_point(&line, &mut scratch).map_err(|error| TestCaseError::fail(error.to_string()))?;
                prop_assert_eq!(point.series_key(), &expected[..]);
                prop_assert_eq!(point.field(b"v"), Some(FieldValue::Integer(1)));
            }

            /// Arbitrary bytes never panic the parser, and an accepted line's
            /// stored-payload accessors agree with the parsed point.
            #[test]
            fn arbitrary_lines_never_panic(line in prop::collection::vec(
                prop::sample::select(b"ab ,=\\\"1.ei-tux0".to_vec()), 0..32)
            ) {
                let mut scratch = IlpScratch::default();
                if let Ok(point) = parse_point(&line, &mut scratch) {
                    let parsed: Vec<_> = point.fields().collect();
                    let stored: Vec<_> = fields(&line).collect();
                    prop_assert_eq!(parsed, stored);
                    prop_assert_eq!(point.timestamp_ns(), timestamp_ns(&line));
                }
            }
        }
    }
}
