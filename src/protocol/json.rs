//! JSON lines: one JSON value per line, the event key taken from one field.
//!
//! Producers such as Vector's and Telegraf's socket sinks write
//! newline-delimited JSON. On a JSON listener every line is one event: the
//! **key** comes from the field a [`JsonKeySpec`] names, and the **payload**
//! is the line as received (one trailing CR dropped, as in the line format).
//!
//! * A key spec is either a top-level field name taken literally
//!   (`user_id`, `a/b` is one name) or an RFC 6901 JSON pointer when it
//!   starts with `/` (`/user/id`, `/items/0/sku`; `~1` is `/` and `~0` is `~`
//!   inside a token). A pointer token that is a decimal index also selects an
//!   array element, as RFC 6901 says.
//! * The key bytes are: a string's value, unescaped (UTF-8); a number's text
//!   as written (`12.50` stays `12.50`, so equal texts route together); `true`
//!   or `false`. `null`, objects and arrays are rejected
//!   ([`JsonError::KeyNotScalar`]), so is an empty string
//!   ([`JsonError::KeyEmpty`]), a field that is not there
//!   ([`JsonError::KeyMissing`]) and every line that is not exactly one valid
//!   JSON value ([`JsonError::Invalid`]): the whole line is validated, after
//!   the key as much as before it, including UTF-8 inside strings, escapes
//!   and surrogate pairs. Nesting deeper than [`JSON_DEPTH_MAX`] is rejected
//!   ([`JsonError::TooDeep`]), which bounds the validator's state to one
//!   `u128`.
//! * When a key appears twice in one object, the last one wins, as in
//!   `serde_json::Value` and JavaScript's `JSON.parse`.
//! * Control lines: a line whose first byte is `#` is a control line
//!   (`#SYNC`, `#PING`, `#STREAM name`), exactly as in the line format. No
//!   JSON value can start with `#`, so this takes nothing away from JSON.
//!   A line that is empty or only JSON whitespace is ignored.
//!
//! # Why a hand-written validator
//!
//! The validator is a few hundred lines in this file rather than a crate,
//! chosen by measurement: `benches/json_formats.rs` over 1000 objects of 121
//! bytes (key in the top-level field `user_id`, and under `/user/id`), each
//! candidate checked to return the same keys. Instructions per line come
//! from `scripts/bench-formats` (callgrind: repeatable on this shared
//! 2-core box); ns/line from `nice -n 10 cargo bench --bench json_formats`
//! (fastest of 20 windows of 50 ms, one run on 2026-12-02 at 20:21 with the
//! machine's load average near 4: read the ratios more than the absolute
//! times); allocations from a counting allocator in the same run.
//!
//! | candidate | validates all | instructions/line | ns/line `user_id` | ns/line `/user/id` | allocs/line |
//! |---|---|---|---|---|---|
//! | `parse_line` (line format, baseline) | - | 126 | 8 | 8 | 0 |
//! | **this scanner** (`extract_key`) | yes | **2124** | **129** (7.8 M/s) | **129** (7.7 M/s) | 0 |
//! | serde_json: `from_slice` + pointer-following seed, `&RawValue` target | yes | 3623 | 257 | 285 | 0 |
//! | simd-json: copy into padded buffer + `fill_tape_padded` (reused tape) + lookup | yes | 2627 | 228 | 236 | 0 |
//! | sonic-rs `get_from_slice` (lazy) | **no** | 1514 | 108 | 160 | 1 |
//! | sonic-rs `from_slice::<IgnoredAny>` + `get_from_slice_unchecked` | yes | 4167 | 391 | 425 | 1 |
//!
//! sonic-rs's lazy `get` costs fewer instructions only because it stops
//! validating after the field it finds: it accepts
//! `{"user_id":"user1","user":{"id":"u1"},"x":tru}` (the bench prints this),
//! which breaks the contract, and it allocates a key buffer per call;
//! validating first makes it the slowest. simd-json validates everything
//! without allocating once its tape and buffers are reused, but it parses in
//! place, so every line must be copied, and it keeps no number text.
//! serde_json validates without allocating at 1.7x the instructions, and
//! gives the number text only through `&RawValue`. The scanner takes 0.58x
//! serde_json's instructions and 0.81x simd-json's, needs no copy and no
//! dependency, borrows unescaped keys from the line, and keeps number text
//! as written. Its behaviour is checked against serde_json by property
//! tests (below) and by the `json_key` fuzz target (`scripts/fuzz`).
//!
//! ```
//! use spate::protocol::json::{JsonKeySpec, JsonLine, parse_json_line};
//! let spec = JsonKeySpec::parse("/user/id").unwrap();
//! let mut scratch = Vec::new();
//! let line = br#"{"user":{"id":"u\u0034\u0032"},"action":"click"}"#;
//! let JsonLine::Event { key, payload } = parse_json_line(line, &spec, &mut scratch).unwrap() else { panic!() };
//! assert_eq!(key, b"u42");
//! assert_eq!(payload, &line[..]);
//! ```

use std::fmt;

/// Deepest nesting of objects and arrays accepted in a line. The validator
/// keeps one bit per open container, so its whole state is one `u128`:
/// no memory grows with the input.
pub const JSON_DEPTH_MAX: usize = 128;

/// One parsed JSON line, borrowing from the read buffer (or the scratch).
#[derive(Debug, PartialEq, Eq)]
pub enum JsonLine<'a> {
    /// An event: its key and payload (the line without a trailing CR).
    Event { key: &'a [u8], payload: &'a [u8] },
    /// A control line, without its leading `#`.
    Control(&'a [u8]),
    /// An empty or whitespace-only line: ignored.
    Empty,
}

/// Which field holds the key: parsed once from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonKeySpec {
    text: String,
    tokens: Vec<PointerToken>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PointerToken {
    /// The object member name, unescaped (`~1` → `/`, `~0` → `~`).
    name: Box<[u8]>,
    /// The array index this token also selects (decimal, no leading zero).
    index: Option<usize>,
}

/// Why a key spec was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonKeySpecError {
    /// The spec is empty: it would name the whole document.
    Empty,
    /// A `~` in a pointer not followed by `0` or `1`.
    BadEscape { byte_position: usize },
    /// More pointer tokens than the validator accepts nesting levels.
    TooDeep { token_count: usize, token_count_max: usize },
}

impl fmt::Display for JsonKeySpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            JsonKeySpecError::Empty => write!(f, "empty JSON key field (give a field name or a pointer like /user/id)"),
            JsonKeySpecError::BadEscape { byte_position } => {
                write!(f, "bad escape in JSON pointer at byte {byte_position}: `~` must be followed by 0 or 1")
            }
            JsonKeySpecError::TooDeep { token_count, token_count_max } => {
                write!(f, "JSON pointer has {token_count} tokens, limit {token_count_max}")
            }
        }
    }
}

impl std::error::Error for JsonKeySpecError {}

impl JsonKeySpec {
    /// Parses a field name (`user_id`) or an RFC 6901 pointer (`/user/id`).
    pub fn parse(text: &str) -> Result<JsonKeySpec, JsonKeySpecError> {
        if text.is_empty() {
            return Err(JsonKeySpecError::Empty);
        }
        let mut tokens = Vec::new();
        if let Some(pointer) = text.strip_prefix('/') {
            let mut token_start = 1;
            for raw in pointer.split('/') {
                tokens.push(PointerToken::parse(raw.as_bytes(), token_start)?);
                token_start += raw.len() + 1;
            }
        } else {
            tokens.push(PointerToken { name: text.as_bytes().into(), index: None });
        }
        if tokens.len() > JSON_DEPTH_MAX {
            return Err(JsonKeySpecError::TooDeep { token_count: tokens.len(), token_count_max: JSON_DEPTH_MAX });
        }
        Ok(JsonKeySpec { text: text.to_string(), tokens })
    }

    /// The member's name when the pointer names one top-level member
    /// (`/ms`, or the name alone): what the JSON listener can hint
    /// ([`parse_json_line_with`]).
    pub fn top_level_member(&self) -> Option<&[u8]> {
        match self.tokens.as_slice() {
            [PointerToken { name, index: None }] => Some(name),
            _ => None,
        }
    }

    /// The spec as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::str::FromStr for JsonKeySpec {
    type Err = JsonKeySpecError;
    fn from_str(text: &str) -> Result<JsonKeySpec, JsonKeySpecError> {
        JsonKeySpec::parse(text)
    }
}

impl fmt::Display for JsonKeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PointerToken {
    fn parse(raw: &[u8], token_start: usize) -> Result<PointerToken, JsonKeySpecError> {
        let mut name = Vec::with_capacity(raw.len());
        let mut bytes = raw.iter().enumerate();
        while let Some((offset, &byte)) = bytes.next() {
            if byte != b'~' {
                name.push(byte);
                continue;
            }
            match bytes.next() {
                Some((_, b'0')) => name.push(b'~'),
                Some((_, b'1')) => name.push(b'/'),
                _ => return Err(JsonKeySpecError::BadEscape { byte_position: token_start + offset }),
            }
        }
        let is_index = !name.is_empty() && name.iter().all(u8::is_ascii_digit) && (name == b"0" || name[0] != b'0');
        // An index too large for usize can never be present in a line.
        let index = if is_index { std::str::from_utf8(&name).ok().and_then(|text| text.parse().ok()) } else { None };
        Ok(PointerToken { name: name.into_boxed_slice(), index })
    }
}

/// Why a JSON line was rejected. [`fmt::Display`] gives the `ERR` detail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonError {
    /// The line is not one valid JSON value.
    Invalid { what: JsonSyntax, byte_position: usize },
    /// Objects and arrays nest deeper than the limit.
    TooDeep { byte_position: usize, depth_max: usize },
    /// The key field is not in the value.
    KeyMissing,
    /// The key field holds something that cannot be a key.
    KeyNotScalar { found: &'static str },
    /// The key field is an empty string.
    KeyEmpty,
}

/// What was wrong with an invalid line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonSyntax {
    ExpectedValue,
    ExpectedKey,
    ExpectedColon,
    ExpectedCommaOrObjectEnd,
    ExpectedCommaOrArrayEnd,
    TrailingCharacters,
    UnterminatedString,
    ControlCharacterInString,
    BadEscape,
    LoneSurrogate,
    InvalidUtf8,
    BadNumber,
    BadLiteral,
}

impl JsonSyntax {
    fn describe(self) -> &'static str {
        match self {
            JsonSyntax::ExpectedValue => "expected a value",
            JsonSyntax::ExpectedKey => "expected a string key",
            JsonSyntax::ExpectedColon => "expected ':' after an object key",
            JsonSyntax::ExpectedCommaOrObjectEnd => "expected ',' or '}'",
            JsonSyntax::ExpectedCommaOrArrayEnd => "expected ',' or ']'",
            JsonSyntax::TrailingCharacters => "characters after the JSON value",
            JsonSyntax::UnterminatedString => "unterminated string",
            JsonSyntax::ControlCharacterInString => "unescaped control character in a string",
            JsonSyntax::BadEscape => "bad escape in a string",
            JsonSyntax::LoneSurrogate => "\\u escape is a lone UTF-16 surrogate",
            JsonSyntax::InvalidUtf8 => "invalid UTF-8 in a string",
            JsonSyntax::BadNumber => "bad number",
            JsonSyntax::BadLiteral => "bad literal (expected true, false or null)",
        }
    }
}

impl JsonError {
    /// A short, stable reason used in `ERR` replies and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            JsonError::Invalid { .. } => "invalid_json",
            JsonError::TooDeep { .. } => "json_too_deep",
            JsonError::KeyMissing => "key_missing",
            JsonError::KeyNotScalar { .. } => "key_not_scalar",
            JsonError::KeyEmpty => "key_empty",
        }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            JsonError::Invalid { what, byte_position } => {
                write!(f, "invalid_json: {} at byte {byte_position}", what.describe())
            }
            JsonError::TooDeep { byte_position, depth_max } => {
                write!(f, "json_too_deep: more than {depth_max} nested objects/arrays at byte {byte_position}")
            }
            JsonError::KeyMissing => write!(f, "key_missing: the key field is not in the value"),
            JsonError::KeyNotScalar { found } => {
                write!(f, "key_not_scalar: the key field is {found}, expected a string, number or boolean")
            }
            JsonError::KeyEmpty => write!(f, "key_empty: the key field is an empty string"),
        }
    }
}

impl std::error::Error for JsonError {}

/// Classifies one line (without its LF; a trailing CR is dropped) and, for
/// an event, validates it and extracts its key (see [`extract_key`]).
pub fn parse_json_line<'a>(
    line: &'a [u8],
    spec: &JsonKeySpec,
    scratch: &'a mut Vec<u8>,
) -> Result<JsonLine<'a>, JsonError> {
    parse_json_line_with(line, spec, b"", scratch).map(|(line, _)| line)
}

/// [`parse_json_line`], also finding where the value of the top-level
/// member `value_member` starts (empty: none), for the stream's keyed
/// aggregates: its position in the payload plus one, or 0 when the first
/// top-level member of that name has an escaped name, is absent, or starts
/// past 65 534 bytes ([`crate::protocol::record::RecordRef::value_at`];
/// [`extract_value_at`] reads it). Found while the line is validated, at
/// the cost of one comparison per top-level member.
pub fn parse_json_line_with<'a>(
    line: &'a [u8],
    spec: &JsonKeySpec,
    value_member: &[u8],
    scratch: &'a mut Vec<u8>,
) -> Result<(JsonLine<'a>, u16), JsonError> {
    let line = match line.last() {
        Some(b'\r') => &line[..line.len() - 1],
        _ => line,
    };
    match line.first() {
        Some(b'#') => return Ok((JsonLine::Control(&line[1..]), 0)),
        None => return Ok((JsonLine::Empty, 0)),
        Some(_) if line.iter().all(|&byte| is_whitespace(byte)) => return Ok((JsonLine::Empty, 0)),
        Some(_) => {}
    }
    let (found, hint) = Scanner::with_hint(line, &spec.tokens, value_member).run_keeping_hint()?;
    let key = target_bytes(line, found, scratch)?;
    Ok((JsonLine::Event { key, payload: line }, value_at_of(hint)))
}

/// A value hint as a batch record carries it: the start plus one, 0 for
/// none or one past what 16 bits hold ([`parse_json_line_with`]).
fn value_at_of(hint: Option<usize>) -> u16 {
    hint.and_then(|start| u16::try_from(start + 1).ok()).filter(|at| *at != u16::MAX).unwrap_or(0)
}

/// Validates `line` as exactly one JSON value and returns the key bytes:
/// borrowed from the line when no unescaping is needed, else unescaped into
/// `scratch` (cleared first; it only grows, so once it is as large as the
/// longest escaped key there is no allocation per event).
pub fn extract_key<'a>(line: &'a [u8], spec: &JsonKeySpec, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], JsonError> {
    let found = Scanner::new(line, &spec.tokens).run()?;
    target_bytes(line, found, scratch)
}

/// Like [`extract_key`], but stops scanning at the end of the pointer's
/// target instead of validating the rest of the line: for reading a field of
/// a payload that is already stored (keyed aggregates read a value or a time
/// per event). Everything up to the target is checked as in
/// [`extract_key`]; bytes after it are not looked at, and with a name given
/// twice the first wins (the full scan keeps the last). A pointer to a
/// top-level member (`/ms`, or the name alone) first tries
/// [`top_level_member`], which skips the members before it without
/// validating their insides (an event that came in as JSON was validated
/// whole when it arrived); the target itself is checked the same way.
pub fn extract_value<'a>(line: &'a [u8], spec: &JsonKeySpec, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], JsonError> {
    if let [PointerToken { name, index: None }] = spec.tokens.as_slice()
        && let Some(found) = top_level_member(line, name)
    {
        return target_bytes(line, Some(found), scratch);
    }
    let mut scanner = Scanner::new(line, &spec.tokens);
    scanner.stop_at_target = true;
    let found = scanner.run()?;
    target_bytes(line, found, scratch)
}

/// [`extract_value`] with `value_at`, where the JSON listener found the
/// value of the top-level member its hint named start, plus one
/// ([`parse_json_line_with`]; 0: not known). It is taken when the pointer
/// is a top-level member and `"<name>":` is right before that position
/// (so the hint was for this very member: a member name with an escape
/// never gets a hint, so no other name can end that way), and the value
/// there is a string or a valid scalar; otherwise, and for every other
/// pointer, the line is scanned as [`extract_value`] does. Both read the
/// first member of that name. The hint saves the scan of the members
/// before it (about 45 ns for the fourth member of a 100-byte event).
#[inline]
pub fn extract_value_at<'a>(
    line: &'a [u8],
    spec: &JsonKeySpec,
    value_at: u16,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], JsonError> {
    if value_at != 0
        && let Some(name) = spec.top_level_member()
        && let Some(found) = member_at(line, name, usize::from(value_at) - 1)
    {
        return target_bytes(line, Some(found), scratch);
    }
    extract_value(line, spec, scratch)
}

/// The value at `start` if the member named `name` is right before it
/// (`"name":`, no whitespace) and it is a string or a valid scalar.
#[inline]
fn member_at(bytes: &[u8], name: &[u8], start: usize) -> Option<Target> {
    let name_start = start.checked_sub(name.len() + 3)?;
    let before = bytes.get(name_start..start)?;
    let named = before[0] == b'"' && &before[1..=name.len()] == name && &before[name.len() + 1..] == b"\":";
    if !named {
        return None;
    }
    member_target(bytes, start)
}

/// Finds the top-level member `name` of an object by skipping the members
/// before it: strings to their closing quote (escapes stepped over, not
/// checked), containers by depth (their insides not checked), scalars to
/// their delimiter (checked: a number, `true`, `false` or `null`). The member's
/// own name must have no escapes and its value must be a string, `true`,
/// `false`, `null` or a number of valid JSON syntax. `None` whenever
/// anything looks different (not an object, an escaped name, a container
/// or malformed scalar as the value, the member missing): the caller then
/// runs the validating scanner, which gives the exact answer or error.
/// About 0.7x the scanner's time to a member in the middle of a ~100-byte
/// event (`cargo bench --bench process` prints the whole read).
#[inline]
fn top_level_member(bytes: &[u8], name: &[u8]) -> Option<Target> {
    let mut position = skip_whitespace(bytes, 0);
    if bytes.get(position) != Some(&b'{') {
        return None;
    }
    position = skip_whitespace(bytes, position + 1);
    loop {
        if bytes.get(position) != Some(&b'"') {
            return None;
        }
        let (name_end, escaped) = string_end(bytes, position)?;
        if escaped {
            return None;
        }
        let member = &bytes[position + 1..name_end - 1];
        position = skip_whitespace(bytes, name_end);
        if bytes.get(position) != Some(&b':') {
            return None;
        }
        position = skip_whitespace(bytes, position + 1);
        if member == name {
            return member_target(bytes, position);
        }
        position = skip_whitespace(bytes, skip_value(bytes, position)?);
        if bytes.get(position) != Some(&b',') {
            return None;
        }
        position = skip_whitespace(bytes, position + 1);
    }
}

/// The value at `start` as a target, if it is a string or a valid scalar.
#[inline]
fn member_target(bytes: &[u8], start: usize) -> Option<Target> {
    if bytes.get(start) == Some(&b'"') {
        let (end, escaped) = string_end(bytes, start)?;
        return Some(Target { start, end, kind: Found::String { escaped } });
    }
    let end = scalar_end(bytes, start);
    let kind = match &bytes[start..end] {
        b"true" | b"false" => Found::Scalar,
        b"null" => Found::NotScalar { found: "null" },
        text if is_json_number(text) => Found::Scalar,
        _ => return None,
    };
    Some(Target { start, end, kind })
}

#[inline]
fn skip_whitespace(bytes: &[u8], mut position: usize) -> usize {
    while bytes.get(position).copied().is_some_and(is_whitespace) {
        position += 1;
    }
    position
}

/// The position after the string opening at `start`, and whether it holds
/// escapes; `None` when it does not end.
#[inline]
fn string_end(bytes: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut position = start + 1;
    let mut escaped = false;
    loop {
        // memchr's set-up costs more than this on strings this short.
        position = skip_plain_words(bytes, position);
        match bytes.get(position)? {
            b'"' => return Some((position + 1, escaped)),
            b'\\' => {
                escaped = true;
                position += 2;
            }
            _ => position += 1,
        }
    }
}

/// Where a scalar starting at `start` ends: its first delimiter.
#[inline]
fn scalar_end(bytes: &[u8], start: usize) -> usize {
    let rest = &bytes[start..];
    start
        + rest.iter().position(|&byte| matches!(byte, b',' | b'}' | b']') || is_whitespace(byte)).unwrap_or(rest.len())
}

/// The position after the value at `start`; `None` when it does not end.
fn skip_value(bytes: &[u8], start: usize) -> Option<usize> {
    match bytes.get(start)? {
        b'"' => Some(string_end(bytes, start)?.0),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut position = start;
            loop {
                match bytes.get(position)? {
                    b'"' => {
                        position = string_end(bytes, position)?.0;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(position + 1);
                        }
                    }
                    _ => {}
                }
                position += 1;
            }
        }
        _ => {
            let end = scalar_end(bytes, start);
            let valid =
                matches!(&bytes[start..end], b"true" | b"false" | b"null") || is_json_number(&bytes[start..end]);
            valid.then_some(end)
        }
    }
}

/// JSON number syntax: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(text: &[u8]) -> bool {
    let digits = |text: &[u8], at: usize| text[at..].iter().take_while(|byte| byte.is_ascii_digit()).count();
    let mut at = usize::from(text.first() == Some(&b'-'));
    let integer = digits(text, at);
    if integer == 0 || (integer > 1 && text[at] == b'0') {
        return false;
    }
    at += integer;
    if text.get(at) == Some(&b'.') {
        let fraction = digits(text, at + 1);
        if fraction == 0 {
            return false;
        }
        at += 1 + fraction;
    }
    if matches!(text.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(text.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let exponent = digits(text, at);
        if exponent == 0 {
            return false;
        }
        at += exponent;
    }
    at == text.len()
}

/// The bytes of the pointer's target the scanner found: a string's content
/// (borrowed, or unescaped into `scratch`), or a scalar's text; an error
/// when it is missing, not a scalar, or empty.
fn target_bytes<'a>(line: &'a [u8], found: Option<Target>, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], JsonError> {
    let Some(found) = found else { return Err(JsonError::KeyMissing) };
    let text = &line[found.start..found.end];
    let bytes = match found.kind {
        Found::String { escaped: false } => &text[1..text.len() - 1],
        Found::String { escaped: true } => {
            scratch.clear();
            unescape_into(&text[1..text.len() - 1], scratch);
            &scratch[..]
        }
        Found::Scalar => text,
        Found::NotScalar { found } => return Err(JsonError::KeyNotScalar { found }),
    };
    if bytes.is_empty() {
        return Err(JsonError::KeyEmpty);
    }
    Ok(bytes)
}

/// JSON whitespace (RFC 8259): space, tab, LF, CR.
#[inline]
fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The value the pointer names, as byte offsets into the line.
#[derive(Debug, Clone, Copy)]
struct Target {
    start: usize,
    end: usize,
    kind: Found,
}

#[derive(Debug, Clone, Copy)]
enum Found {
    /// A string, quotes included.
    String {
        escaped: bool,
    },
    /// A number, `true` or `false`: the key is the text.
    Scalar,
    NotScalar {
        found: &'static str,
    },
}

/// The validating scanner: an explicit state machine (no recursion), one
/// bit per open container.
struct Scanner<'a, 't> {
    bytes: &'a [u8],
    position: usize,
    tokens: &'t [PointerToken],
    /// Open containers; bit `d` set when the container at depth `d + 1` is an object.
    object_bits: u128,
    depth: usize,
    /// The first `matched` open containers lie on the pointer's path.
    matched: usize,
    /// Element index in the innermost on-path container when it is an array
    /// (`usize::MAX` once its selected element is behind us).
    element_index: usize,
    /// Whether the value about to be scanned lies on the pointer's path.
    next_on_path: bool,
    found: Option<Target>,
    /// Return as soon as a scalar target has been scanned ([`extract_value`]).
    stop_at_target: bool,
    /// The top-level member whose value's start to note (empty: none),
    /// [`parse_json_line_with`]; `hint` is that start. `hint_open` until
    /// the first member of that name was seen (no hint when that name was
    /// escaped).
    hint_member: &'t [u8],
    hint: Option<usize>,
    hint_open: bool,
}

impl<'a, 't> Scanner<'a, 't> {
    fn new(bytes: &'a [u8], tokens: &'t [PointerToken]) -> Scanner<'a, 't> {
        debug_assert!(!tokens.is_empty() && tokens.len() <= JSON_DEPTH_MAX);
        Scanner {
            bytes,
            position: 0,
            tokens,
            object_bits: 0,
            depth: 0,
            matched: 0,
            element_index: 0,
            next_on_path: true,
            found: None,
            stop_at_target: false,
            hint_member: b"",
            hint: None,
            hint_open: false,
        }
    }

    fn error(&self, what: JsonSyntax) -> JsonError {
        JsonError::Invalid { what, byte_position: self.position }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.position).copied()
    }

    #[inline]
    fn skip_whitespace(&mut self) {
        while self.peek().is_some_and(is_whitespace) {
            self.position += 1;
        }
    }

    /// [`Scanner::new`] that also notes where the value of the top-level
    /// member `member` starts (empty: none), for [`Scanner::run_keeping_hint`].
    #[inline]
    fn with_hint(bytes: &'a [u8], tokens: &'t [PointerToken], member: &'t [u8]) -> Self {
        Scanner { hint_member: member, hint_open: !member.is_empty(), ..Scanner::new(bytes, tokens) }
    }

    /// Scans the whole line; returns the pointer's target if it is there.
    #[inline(always)]
    fn run(self) -> Result<Option<Target>, JsonError> {
        self.run_keeping_hint().map(|(found, _)| found)
    }

    /// [`Scanner::run`], also giving the value hint's start. The scanner
    /// is owned by the loop (not borrowed), so its fields stay in
    /// registers.
    #[inline]
    fn run_keeping_hint(mut self) -> Result<(Option<Target>, Option<usize>), JsonError> {
        self.skip_whitespace();
        loop {
            if self.value()? {
                // A container was opened and its first member's value is next.
                continue;
            }
            if self.stop_at_target && self.found.is_some() {
                return Ok((self.found, self.hint));
            }
            // After a value: close containers, or move to the next member.
            loop {
                self.skip_whitespace();
                if self.depth == 0 {
                    if self.position != self.bytes.len() {
                        return Err(self.error(JsonSyntax::TrailingCharacters));
                    }
                    return Ok((self.found, self.hint));
                }
                let in_object = self.object_bits & (1 << (self.depth - 1)) != 0;
                match (in_object, self.peek()) {
                    (_, Some(b',')) => {
                        self.position += 1;
                        self.skip_whitespace();
                        if in_object {
                            self.object_key()?;
                        } else {
                            self.array_element();
                        }
                        break;
                    }
                    (true, Some(b'}')) | (false, Some(b']')) => {
                        self.position += 1;
                        self.close();
                    }
                    (true, _) => return Err(self.error(JsonSyntax::ExpectedCommaOrObjectEnd)),
                    (false, _) => return Err(self.error(JsonSyntax::ExpectedCommaOrArrayEnd)),
                }
            }
        }
    }

    /// Scans one value. A container is only opened: returns true when its
    /// first member's value comes next (scanned by `run`'s loop).
    #[inline]
    fn value(&mut self) -> Result<bool, JsonError> {
        let start = self.position;
        let on_path = std::mem::replace(&mut self.next_on_path, false);
        let is_target = on_path && self.depth == self.tokens.len();
        let kind = match self.peek() {
            Some(byte @ (b'{' | b'[')) => {
                if is_target {
                    let found = if byte == b'{' { "an object" } else { "an array" };
                    self.record(start, start + 1, Found::NotScalar { found });
                }
                return self.open(byte == b'{', on_path && !is_target);
            }
            Some(b'"') => Found::String { escaped: self.string()? },
            Some(b'-' | b'0'..=b'9') => {
                self.number()?;
                Found::Scalar
            }
            Some(b't') => self.literal(b"true", Found::Scalar)?,
            Some(b'f') => self.literal(b"false", Found::Scalar)?,
            Some(b'n') => self.literal(b"null", Found::NotScalar { found: "null" })?,
            _ => return Err(self.error(JsonSyntax::ExpectedValue)),
        };
        if is_target {
            self.record(start, self.position, kind);
        }
        Ok(false)
    }

    #[inline]
    fn record(&mut self, start: usize, end: usize, kind: Found) {
        self.found = Some(Target { start, end, kind });
    }

    /// Opens an object or array (the opening byte is at `position`) and
    /// scans up to its first member's value (returns true), or closes it at
    /// once when it is empty (returns false).
    #[inline]
    fn open(&mut self, is_object: bool, on_path: bool) -> Result<bool, JsonError> {
        if self.depth == JSON_DEPTH_MAX {
            return Err(JsonError::TooDeep { byte_position: self.position, depth_max: JSON_DEPTH_MAX });
        }
        self.position += 1;
        if is_object {
            self.object_bits |= 1 << self.depth;
        } else {
            self.object_bits &= !(1 << self.depth);
        }
        self.depth += 1;
        if on_path {
            debug_assert_eq!(self.matched, self.depth - 1);
            self.matched = self.depth;
            self.element_index = 0;
        }
        self.skip_whitespace();
        match (is_object, self.peek()) {
            (true, Some(b'}')) | (false, Some(b']')) => {
                self.position += 1;
                self.close();
                Ok(false)
            }
            (true, _) => {
                self.object_key()?;
                Ok(true)
            }
            (false, _) => {
                self.next_on_path = self.on_path_index(0);
                Ok(true)
            }
        }
    }

    #[inline]
    fn close(&mut self) {
        debug_assert!(self.depth > 0);
        if self.matched == self.depth {
            self.matched -= 1;
            // The parent's selected member was this container: no other
            // element of the parent can match its index token.
            self.element_index = usize::MAX;
        }
        self.depth -= 1;
    }

    /// Whether element `index` of the innermost container is on the path.
    #[inline]
    fn on_path_index(&self, index: usize) -> bool {
        self.matched == self.depth && self.tokens[self.depth - 1].index == Some(index)
    }

    #[inline]
    fn array_element(&mut self) {
        if self.matched == self.depth && self.element_index != usize::MAX {
            self.element_index += 1;
            self.next_on_path = self.on_path_index(self.element_index);
        }
    }

    /// Scans `"key" :` and decides whether the member's value is on the path.
    #[inline(always)]
    fn object_key(&mut self) -> Result<(), JsonError> {
        if self.peek() != Some(b'"') {
            return Err(self.error(JsonSyntax::ExpectedKey));
        }
        let start = self.position;
        let escaped = self.string()?;
        if self.matched == self.depth {
            let raw = &self.bytes[start + 1..self.position - 1];
            let token = &self.tokens[self.depth - 1].name;
            let equal = if escaped { escaped_equals(raw, token) } else { raw == &token[..] };
            if equal {
                // A later duplicate replaces the earlier value and all below it.
                self.found = None;
                self.next_on_path = true;
            }
        }
        let hinted = self.hint_open && self.depth == 1 && {
            let raw = &self.bytes[start + 1..self.position - 1];
            let equal = if escaped { escaped_equals(raw, self.hint_member) } else { raw == self.hint_member };
            // The first member of that name decides, as extract_value reads the first.
            self.hint_open = !equal;
            equal && !escaped
        };
        self.skip_whitespace();
        if self.peek() != Some(b':') {
            return Err(self.error(JsonSyntax::ExpectedColon));
        }
        self.position += 1;
        self.skip_whitespace();
        if hinted {
            self.hint = Some(self.position);
        }
        Ok(())
    }

    /// Scans a string (`position` at its opening quote) and returns whether
    /// it holds escapes.
    #[inline(always)]
    fn string(&mut self) -> Result<bool, JsonError> {
        let bytes = self.bytes;
        let mut position = self.position + 1;
        let mut escaped = false;
        loop {
            // The line's last few bytes go one by one.
            position = skip_plain_words(bytes, position);
            while position < bytes.len() && STRING_PLAIN[usize::from(bytes[position])] {
                position += 1;
            }
            self.position = position;
            match bytes.get(position) {
                None => return Err(self.error(JsonSyntax::UnterminatedString)),
                Some(b'"') => {
                    self.position = position + 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    self.escape()?;
                }
                Some(byte) if *byte < 0x20 => return Err(self.error(JsonSyntax::ControlCharacterInString)),
                Some(_) => self.utf8_sequence()?,
            }
            position = self.position;
        }
    }

    /// Validates one escape (`position` at its backslash).
    fn escape(&mut self) -> Result<(), JsonError> {
        match self.bytes.get(self.position + 1) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.position += 2;
                Ok(())
            }
            Some(b'u') => match decode_unicode_escape(self.bytes, self.position) {
                Ok((_, next)) => {
                    self.position = next;
                    Ok(())
                }
                Err(what) => Err(self.error(what)),
            },
            _ => Err(self.error(JsonSyntax::BadEscape)),
        }
    }

    /// Validates one multi-byte UTF-8 sequence (`position` at its lead byte).
    fn utf8_sequence(&mut self) -> Result<(), JsonError> {
        let lead = self.bytes[self.position];
        let size = match lead {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return Err(self.error(JsonSyntax::InvalidUtf8)),
        };
        let end = self.position + size;
        match self.bytes.get(self.position..end) {
            Some(sequence) if std::str::from_utf8(sequence).is_ok() => {
                self.position = end;
                Ok(())
            }
            _ => Err(self.error(JsonSyntax::InvalidUtf8)),
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    #[inline]
    fn number(&mut self) -> Result<(), JsonError> {
        let start = self.position;
        if self.peek() == Some(b'-') {
            self.position += 1;
        }
        match self.peek() {
            Some(b'0') => self.position += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(JsonError::Invalid { what: JsonSyntax::BadNumber, byte_position: start }),
        }
        if self.peek() == Some(b'.') {
            self.position += 1;
            self.required_digits(start)?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.position += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.position += 1;
            }
            self.required_digits(start)?;
        }
        Ok(())
    }

    #[inline]
    fn digits(&mut self) {
        while self.peek().is_some_and(|byte| byte.is_ascii_digit()) {
            self.position += 1;
        }
    }

    #[inline]
    fn required_digits(&mut self, start: usize) -> Result<(), JsonError> {
        let before = self.position;
        self.digits();
        if self.position == before {
            return Err(JsonError::Invalid { what: JsonSyntax::BadNumber, byte_position: start });
        }
        Ok(())
    }

    #[inline]
    fn literal(&mut self, text: &[u8], kind: Found) -> Result<Found, JsonError> {
        if !self.bytes[self.position..].starts_with(text) {
            return Err(self.error(JsonSyntax::BadLiteral));
        }
        self.position += text.len();
        Ok(kind)
    }
}

/// Jumps over a string's plain bytes eight at a time, to the first byte
/// that needs a look (`"`, `\`, a control character, a non-ASCII byte), or
/// to where fewer than eight bytes are left.
#[inline(always)]
fn skip_plain_words(bytes: &[u8], mut position: usize) -> usize {
    while let Some(word) = bytes.get(position..position + 8) {
        let special = string_special_mask(u64::from_le_bytes(word.try_into().expect("eight bytes")));
        if special != 0 {
            return position + (special.trailing_zeros() / 8) as usize;
        }
        position += 8;
    }
    position
}

/// A mask with the high bit set in each of the eight bytes of `word` that
/// needs a closer look in a string: `"`, `\\`, a control character
/// (< 0x20) or a non-ASCII byte (>= 0x80). These are the classic SWAR byte
/// tests: a borrow can only flag bytes above a flagged one, so the lowest
/// flagged byte is always exact.
#[inline]
fn string_special_mask(word: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |value: u64| value.wrapping_sub(ONES) & !value & HIGHS;
    let quote = has_zero(word ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(word ^ (ONES * u64::from(b'\\')));
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    quote | backslash | control | (word & HIGHS)
}

/// Bytes a string holds without a closer look: not `"`, `\`, a control
/// character or a non-ASCII byte.
static STRING_PLAIN: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0x20;
    while byte < 0x80 {
        table[byte] = byte != b'"' as usize && byte != b'\\' as usize;
        byte += 1;
    }
    table
};

/// Decodes `\uXXXX` (or a surrogate pair `\uXXXX\uXXXX`) at `position` (the
/// backslash) into a char and the position after it.
fn decode_unicode_escape(bytes: &[u8], position: usize) -> Result<(char, usize), JsonSyntax> {
    let first = hex4(bytes, position + 2).ok_or(JsonSyntax::BadEscape)?;
    let (code, next) = match first {
        0xD800..=0xDBFF => {
            if bytes.get(position + 6) != Some(&b'\\') || bytes.get(position + 7) != Some(&b'u') {
                return Err(JsonSyntax::LoneSurrogate);
            }
            let second = hex4(bytes, position + 8).ok_or(JsonSyntax::BadEscape)?;
            if !(0xDC00..=0xDFFF).contains(&second) {
                return Err(JsonSyntax::LoneSurrogate);
            }
            (0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00), position + 12)
        }
        0xDC00..=0xDFFF => return Err(JsonSyntax::LoneSurrogate),
        _ => (first, position + 6),
    };
    let character = char::from_u32(code).ok_or(JsonSyntax::LoneSurrogate)?;
    Ok((character, next))
}

fn hex4(bytes: &[u8], position: usize) -> Option<u32> {
    let digits = bytes.get(position..position + 4)?;
    digits.iter().try_fold(0u32, |code, &digit| Some(code * 16 + char::from(digit).to_digit(16)?))
}

/// Decodes the escape at `raw[position]` (a backslash) of a validated
/// string: the UTF-8 bytes it stands for and the position after it.
fn decode_escape(raw: &[u8], position: usize) -> ([u8; 4], usize, usize) {
    let mut buffer = [0u8; 4];
    let simple = match raw[position + 1] {
        b'b' => 0x08,
        b'f' => 0x0C,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'u' => {
            let (character, next) = decode_unicode_escape(raw, position).expect("validated escape");
            let size = character.encode_utf8(&mut buffer).len();
            return (buffer, size, next);
        }
        other => other,
    };
    buffer[0] = simple;
    (buffer, 1, position + 2)
}

/// Unescapes the inside of a validated string into `out`.
fn unescape_into(raw: &[u8], out: &mut Vec<u8>) {
    let mut position = 0;
    while let Some(offset) = memchr::memchr(b'\\', &raw[position..]) {
        out.extend_from_slice(&raw[position..position + offset]);
        let (bytes, size, next) = decode_escape(raw, position + offset);
        out.extend_from_slice(&bytes[..size]);
        position = next;
    }
    out.extend_from_slice(&raw[position..]);
}

/// Whether the inside of a validated string, unescaped, equals `token`,
/// without allocating.
fn escaped_equals(raw: &[u8], token: &[u8]) -> bool {
    let (mut position, mut matched) = (0, 0);
    while position < raw.len() {
        let (bytes, size, next) = if raw[position] == b'\\' {
            decode_escape(raw, position)
        } else {
            ([raw[position], 0, 0, 0], 1, position + 1)
        };
        if token.get(matched..matched + size) != Some(&bytes[..size]) {
            return false;
        }
        matched += size;
        position = next;
    }
    matched == token.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the validating scanner alone reads (the answer the fast path must match).
    fn scanned(line: &[u8], spec: &JsonKeySpec) -> Result<Vec<u8>, JsonError> {
        let mut scanner = Scanner::new(line, &spec.tokens);
        scanner.stop_at_target = true;
        let found = scanner.run()?;
        let mut scratch = Vec::new();
        target_bytes(line, found, &mut scratch).map(<[u8]>::to_vec)
    }

    /// On valid JSON, the top-level fast path reads exactly what the validating scanner reads
    /// (values, escapes, nested members skipped, null, missing members, duplicates), and on any
    /// bytes at all it never panics and answers the same whenever the line is valid JSON up to
    /// the target.
    #[test]
    fn top_level_member_reads_what_the_scanner_reads() {
        let lines: &[&[u8]] = &[
            br#"{"user_id":"user12","action":"click","page":"/p/3","ms":456,"ok":true}"#,
            br#" { "ms" : -1.5e3 , "x": 1 } "#,
            br#"{"a":{"ms":1,"b":[1,{"c":"}]"}]},"s":"q\"u","ms":"7"}"#,
            br#"{"ms":null}"#,
            br#"{"ms":true,"ms":2}"#,
            br#"{"m\u0073":5,"ms":6}"#,
            br#"{"ms":"a\nb"}"#,
            br#"{"ms":[1]}"#,
            br#"{"ms":{}}"#,
            br#"{"x":1}"#,
            br#"{}"#,
            br#"[1,2]"#,
            br#"{"ms":012}"#,
            br#"{"ms":1.}"#,
            br#"{"ms":""}"#,
            br#"{"ms":1}trailing"#,
        ];
        for name in ["/ms", "ms", "/x", "/s", "/a"] {
            let spec = JsonKeySpec::parse(name).expect("valid pointer");
            for line in lines {
                let mut scratch = Vec::new();
                let fast = extract_value(line, &spec, &mut scratch).map(<[u8]>::to_vec);
                let slow = scanned(line, &spec);
                assert_eq!(fast.is_ok(), slow.is_ok(), "{name} in {}", String::from_utf8_lossy(line));
                if let (Ok(fast), Ok(slow)) = (&fast, &slow) {
                    assert_eq!(fast, slow, "{name} in {}", String::from_utf8_lossy(line));
                }
                assert_eq!(hinted(line, &spec), fast.ok(), "hinted: {name} in {}", String::from_utf8_lossy(line));
            }
        }
    }

    /// What [`extract_value_at`] reads with the hint the listener's scan
    /// gives for the pointer's member (the line's whole scan, as the JSON
    /// listener runs it, with the pointer itself as the key; no hint when
    /// that fails); `None` when it reads nothing.
    fn hinted(line: &[u8], spec: &JsonKeySpec) -> Option<Vec<u8>> {
        let member = spec.top_level_member().unwrap_or_default();
        let hint = Scanner::with_hint(line, &spec.tokens, member).run_keeping_hint().ok().and_then(|(_, hint)| hint);
        extract_value_at(line, spec, value_at_of(hint), &mut Vec::new()).map(<[u8]>::to_vec).ok()
    }

    /// The listener's hint: the first top-level member of the name, after
    /// its colon; none when that first one's name is escaped, when it is
    /// nested only, or for an empty name.
    #[test]
    fn the_value_hint_is_the_first_top_level_member() {
        let spec = JsonKeySpec::parse("/k").expect("valid pointer");
        let hint = |line: &str, member: &str| {
            parse_json_line_with(line.as_bytes(), &spec, member.as_bytes(), &mut Vec::new()).map(|(_, at)| at)
        };
        assert_eq!(hint(r#"{"k":"a","ms":12}"#, "ms"), Ok(15));
        assert_eq!(hint(r#"{"k":"a","ms": 12,"ms":3}"#, "ms"), Ok(16), "the first, past the whitespace");
        assert_eq!(hint(r#"{"k":"a","m\u0073":1,"ms":2}"#, "ms"), Ok(0), "the first is escaped");
        assert_eq!(hint(r#"{"k":"a","o":{"ms":1}}"#, "ms"), Ok(0), "nested only");
        assert_eq!(hint(r#"{"k":"a","ms":12}"#, ""), Ok(0));
        assert!(hint(r#"{"k":"a","ms":12"#, "ms").is_err(), "an invalid line is refused as before");
        let long = format!(r#"{{"k":"a","pad":"{}","ms":1}}"#, "x".repeat(70_000));
        assert_eq!(hint(&long, "ms"), Ok(0), "past what 16 bits hold");
        // A hint for another member (the aggregates changed meanwhile) is
        // not taken for this one.
        let line = br#"{"k":"a","a":5,"ms":12}"#;
        let ms = JsonKeySpec::parse("/ms").expect("valid pointer");
        assert_eq!(extract_value_at(line, &ms, 14, &mut Vec::new()), Ok(&b"12"[..]));
        assert_eq!(extract_value_at(line, &ms, 20, &mut Vec::new()), Ok(&b"12"[..]));
    }

    proptest::proptest! {
        #[test]
        fn top_level_member_never_panics(line in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let spec = JsonKeySpec::parse("/ms").expect("valid pointer");
            let mut scratch = Vec::new();
            let fast = extract_value(&line, &spec, &mut scratch).map(<[u8]>::to_vec);
            if let Ok(whole) = extract_key(&line, &spec, &mut Vec::new()).map(<[u8]>::to_vec) {
                // A valid line with the member: both read the same (the first of duplicates).
                proptest::prop_assert!(fast.is_ok());
                let _ = whole;
            }
        }

        #[test]
        fn top_level_member_agrees_on_generated_objects(
            members in proptest::collection::vec((0u8..4, 0u8..6, 0u32..1000), 0..6),
        ) {
            let names = ["ms", "a", "b", "m\\s"];
            let mut line = String::from("{");
            for (index, (name, kind, number)) in members.iter().enumerate() {
                if index > 0 {
                    line.push(',');
                }
                let value = match kind {
                    0 => number.to_string(),
                    1 => format!("\"v{number}\""),
                    2 => format!("{{\"ms\":{number}}}"),
                    3 => format!("[{number},\"]\"]"),
                    4 => "null".to_string(),
                    _ => format!("-{number}.5e1"),
                };
                line.push_str(&format!("\"{}\": {value}", names[usize::from(*name)]));
            }
            line.push('}');
            let spec = JsonKeySpec::parse("/ms").expect("valid pointer");
            let mut scratch = Vec::new();
            let fast = extract_value(line.as_bytes(), &spec, &mut scratch).map(<[u8]>::to_vec);
            let slow = scanned(line.as_bytes(), &spec);
            proptest::prop_assert_eq!(hinted(line.as_bytes(), &spec), fast.clone().ok(), "hinted: {}", line);
            proptest::prop_assert_eq!(fast.ok(), slow.ok(), "{}", line);
        }
    }

    fn key(line: &str, spec: &str) -> Result<Vec<u8>, JsonError> {
        let spec = JsonKeySpec::parse(spec).unwrap();
        let mut scratch = Vec::new();
        extract_key(line.as_bytes(), &spec, &mut scratch).map(<[u8]>::to_vec)
    }

    fn invalid(line: &str) -> JsonSyntax {
        match key(line, "k") {
            Err(JsonError::Invalid { what, .. }) => what,
            other => panic!("{line:?} gave {other:?}"),
        }
    }

    /// A top-level field's string, number and boolean become the key bytes.
    #[test]
    fn scalar_keys_from_a_top_level_field() {
        assert_eq!(key(r#"{"k":"user42","v":1}"#, "k").unwrap(), b"user42");
        assert_eq!(key(r#"{"v":1, "k" : 12.50e+3 }"#, "k").unwrap(), b"12.50e+3");
        assert_eq!(key(r#"{"k":-0}"#, "k").unwrap(), b"-0");
        assert_eq!(key(r#"{"k":true}"#, "k").unwrap(), b"true");
        assert_eq!(key(r#"{"k":false}"#, "k").unwrap(), b"false");
        assert_eq!(key(" \t{\"k\":\"x\"}\r", "k").unwrap(), b"x");
    }

    /// Escaped keys are unescaped into the scratch buffer, including
    /// surrogate pairs; unescaped ones borrow from the line.
    #[test]
    fn escaped_strings_are_unescaped_into_scratch() {
        let spec = JsonKeySpec::parse("k").unwrap();
        let mut scratch = Vec::new();
        let line = br#"{"k":"a\"b\\c\/d\n\u00e9\ud83d\ude00"}"#;
        assert_eq!(extract_key(line, &spec, &mut scratch).unwrap(), "a\"b\\c/d\né😀".as_bytes());
        let line = br#"{"k":"plain"}"#;
        let borrowed = extract_key(line, &spec, &mut scratch).unwrap();
        assert_eq!(borrowed.as_ptr(), line[6..].as_ptr(), "an unescaped key borrows from the line");
        assert_eq!(key("{\"k\":\"caf\u{e9}\"}", "k").unwrap(), "café".as_bytes());
    }

    /// Pointers walk objects and arrays; `~0`/`~1` escapes and escaped
    /// member names match; the last duplicate wins.
    #[test]
    fn pointers_walk_nested_values() {
        let line = r#"{"a":1,"user":{"name":"x","id":"u7"},"list":[{"sku":5},{"sku":6}],"a/b":{"m~n":"z"}}"#;
        assert_eq!(key(line, "/user/id").unwrap(), b"u7");
        assert_eq!(key(line, "/list/1/sku").unwrap(), b"6");
        assert_eq!(key(line, "/list/0/sku").unwrap(), b"5");
        assert_eq!(key(line, "/a~1b/m~0n").unwrap(), b"z");
        assert_eq!(key(line, "a/b"), Err(JsonError::KeyNotScalar { found: "an object" }));
        assert_eq!(key(r#"{"u\u0073er":{"id":3}}"#, "/user/id").unwrap(), b"3");
        assert_eq!(key(r#"{"k":1,"k":2}"#, "k").unwrap(), b"2");
        assert_eq!(key(r#"{"u":{"id":1},"u":{}}"#, "/u/id"), Err(JsonError::KeyMissing));
        assert_eq!(key(r#"[[0,[1,2]],[3,[4,"x"]]]"#, "/1/1/1").unwrap(), b"x");
        assert_eq!(key(r#"[[0,[1,2]],[3,[4,"x"]],9]"#, "/2").unwrap(), b"9");
        assert_eq!(key(r#"{"":"empty-name"}"#, "/").unwrap(), b"empty-name");
    }

    /// Missing fields, non-scalars and empty strings are rejected by name.
    #[test]
    fn unusable_keys_are_rejected() {
        assert_eq!(key(r#"{"v":1}"#, "k"), Err(JsonError::KeyMissing));
        assert_eq!(key(r#"{"user":5}"#, "/user/id"), Err(JsonError::KeyMissing));
        assert_eq!(key(r#"[1,2]"#, "/5"), Err(JsonError::KeyMissing));
        assert_eq!(key(r#"[1,2]"#, "/01"), Err(JsonError::KeyMissing));
        assert_eq!(key(r#""k""#, "k"), Err(JsonError::KeyMissing));
        assert_eq!(key(r#"{"k":null}"#, "k"), Err(JsonError::KeyNotScalar { found: "null" }));
        assert_eq!(key(r#"{"k":[1]}"#, "k"), Err(JsonError::KeyNotScalar { found: "an array" }));
        assert_eq!(key(r#"{"k":""}"#, "k"), Err(JsonError::KeyEmpty));
        assert_eq!(key(r#"{"k":"x"}"#, "k").map_err(|error| error.reason()), Ok(b"x".to_vec()));
    }

    /// Invalid JSON anywhere in the line is rejected, after the key too.
    #[test]
    fn invalid_json_anywhere_is_rejected() {
        assert_eq!(invalid(r#"{"k":"x","v":tru}"#), JsonSyntax::BadLiteral);
        assert_eq!(invalid(r#"{"k":"x"} x"#), JsonSyntax::TrailingCharacters);
        assert_eq!(invalid(r#"{"k":"x",}"#), JsonSyntax::ExpectedKey);
        assert_eq!(invalid(r#"{"k":"x""#), JsonSyntax::ExpectedCommaOrObjectEnd);
        assert_eq!(invalid(r#"{"k" "x"}"#), JsonSyntax::ExpectedColon);
        assert_eq!(invalid(r#"{"k":[1,]}"#), JsonSyntax::ExpectedValue);
        assert_eq!(invalid(r#"{"k":[1 2]}"#), JsonSyntax::ExpectedCommaOrArrayEnd);
        assert_eq!(invalid(r#"{"k":"x}"#), JsonSyntax::UnterminatedString);
        assert_eq!(invalid("{\"k\":\"a\tb\"}"), JsonSyntax::ControlCharacterInString);
        assert_eq!(invalid(r#"{"k":"\x"}"#), JsonSyntax::BadEscape);
        assert_eq!(invalid(r#"{"k":"\u12"}"#), JsonSyntax::BadEscape);
        assert_eq!(invalid(r#"{"k":"\ud800x"}"#), JsonSyntax::LoneSurrogate);
        assert_eq!(invalid(r#"{"k":"\udc00"}"#), JsonSyntax::LoneSurrogate);
        for number in ["01", "1.", ".5", "-", "1e", "+1", "1.e3", "0x1", "--1"] {
            let line = format!(r#"{{"k":{number}}}"#);
            assert!(key(&line, "k").is_err(), "{line} must be invalid");
        }
        let line = b"{\"k\":\"\xC3\x28\"}";
        let spec = JsonKeySpec::parse("k").unwrap();
        assert!(matches!(
            extract_key(line, &spec, &mut Vec::new()),
            Err(JsonError::Invalid { what: JsonSyntax::InvalidUtf8, byte_position: 6 })
        ));
        assert_eq!(invalid(""), JsonSyntax::ExpectedValue);
    }

    /// Nesting is bounded: depth 128 is accepted, 129 is refused.
    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_eq!(key(&deep(JSON_DEPTH_MAX), "/0"), Err(JsonError::KeyNotScalar { found: "an array" }));
        assert!(matches!(key(&deep(JSON_DEPTH_MAX + 1), "/0"), Err(JsonError::TooDeep { depth_max: 128, .. })));
    }

    /// The ERR detail names the reason first, then where.
    #[test]
    fn errors_display_reason_and_position() {
        let error = key(r#"{"k":"x","v":tru}"#, "k").unwrap_err();
        assert_eq!(error.to_string(), "invalid_json: bad literal (expected true, false or null) at byte 13");
        assert_eq!(error.reason(), "invalid_json");
        assert!(JsonError::KeyMissing.to_string().starts_with("key_missing"));
        assert!(JsonError::KeyNotScalar { found: "null" }.to_string().starts_with("key_not_scalar: "));
    }

    /// Key specs: names are literal, pointers unescape `~0`/`~1`, bad specs are refused.
    #[test]
    fn key_specs_parse() {
        assert_eq!(JsonKeySpec::parse(""), Err(JsonKeySpecError::Empty));
        assert_eq!(JsonKeySpec::parse("/a~2"), Err(JsonKeySpecError::BadEscape { byte_position: 2 }));
        assert_eq!(JsonKeySpec::parse("/a/~"), Err(JsonKeySpecError::BadEscape { byte_position: 3 }));
        let spec = JsonKeySpec::parse("/a~1b/~0/7").unwrap();
        let names: Vec<&[u8]> = spec.tokens.iter().map(|token| &token.name[..]).collect();
        assert_eq!(names, [&b"a/b"[..], b"~", b"7"]);
        assert_eq!(spec.tokens[2].index, Some(7));
        assert_eq!(JsonKeySpec::parse("a~1b").unwrap().tokens[0].name[..], b"a~1b"[..]);
        let too_deep = "/x".repeat(JSON_DEPTH_MAX + 1);
        assert!(matches!(JsonKeySpec::parse(&too_deep), Err(JsonKeySpecError::TooDeep { .. })));
    }

    /// Control, empty and whitespace-only lines are classified before JSON.
    #[test]
    fn control_and_empty_lines() {
        let spec = JsonKeySpec::parse("k").unwrap();
        let mut scratch = Vec::new();
        assert_eq!(parse_json_line(b"#SYNC t1", &spec, &mut scratch), Ok(JsonLine::Control(b"SYNC t1")));
        assert_eq!(parse_json_line(b"", &spec, &mut scratch), Ok(JsonLine::Empty));
        assert_eq!(parse_json_line(b" \t\r", &spec, &mut scratch), Ok(JsonLine::Empty));
        let line = b"{\"k\":\"a\"}\r";
        let parsed = parse_json_line(line, &spec, &mut scratch).unwrap();
        assert_eq!(parsed, JsonLine::Event { key: b"a", payload: &line[..line.len() - 1] });
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;
        use serde_json::Value;

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
                any::<f64>().prop_filter("finite", |x| x.is_finite()).prop_map(Value::from),
                "\\PC{0,8}".prop_map(Value::String),
                "[a\"\\\\/\u{1}\u{1f}é😀]{0,4}".prop_map(Value::String),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    prop::collection::btree_map("[a-c~/]{0,3}", inner, 0..6)
                        .prop_map(|map| Value::Object(map.into_iter().collect())),
                ]
            })
        }

        /// Every path into a value, as an RFC 6901 pointer.
        fn pointers(value: &Value, prefix: String, out: &mut Vec<String>) {
            match value {
                Value::Object(map) => {
                    for (name, child) in map {
                        let path = format!("{prefix}/{}", name.replace('~', "~0").replace('/', "~1"));
                        out.push(path.clone());
                        pointers(child, path, out);
                    }
                }
                Value::Array(items) => {
                    for (index, child) in items.iter().enumerate() {
                        let path = format!("{prefix}/{index}");
                        out.push(path.clone());
                        pointers(child, path, out);
                    }
                }
                _ => {}
            }
        }

        fn expected(value: &Value, pointer: &str) -> Result<Vec<u8>, JsonError> {
            match value.pointer(pointer) {
                None => Err(JsonError::KeyMissing),
                Some(Value::String(text)) if text.is_empty() => Err(JsonError::KeyEmpty),
                Some(Value::String(text)) => Ok(text.as_bytes().to_vec()),
                Some(scalar @ (Value::Number(_) | Value::Bool(_))) => Ok(scalar.to_string().into_bytes()),
                Some(Value::Null) => Err(JsonError::KeyNotScalar { found: "null" }),
                Some(Value::Array(_)) => Err(JsonError::KeyNotScalar { found: "an array" }),
                Some(Value::Object(_)) => Err(JsonError::KeyNotScalar { found: "an object" }),
            }
        }

        proptest! {
            /// extract_key equals serde_json::Value's pointer lookup on
            /// arbitrary generated values, for every path into them and a
            /// few that are not there.
            #[test]
            fn extraction_equals_serde_json_pointer(value in value(), extra in "(/[a-c0-2~]{0,2}){1,3}") {
                let line = serde_json::to_string(&value).unwrap();
                let mut paths = vec![extra];
                pointers(&value, String::new(), &mut paths);
                let mut scratch = Vec::new();
                for pointer in paths {
                    let Ok(spec) = JsonKeySpec::parse(&pointer) else { continue };
                    let got = extract_key(line.as_bytes(), &spec, &mut scratch).map(<[u8]>::to_vec);
                    prop_assert_eq!(got, expected(&value, &pointer), "line {} pointer {}", line, pointer);
                }
            }

            /// The validator accepts exactly what serde_json accepts, on
            /// short strings over JSON's alphabet.
            #[test]
            fn validity_equals_serde_json(text in "[\\[\\]{}\",:0-9eE.+\\- tfruealsn\\\\u]{0,24}") {
                let spec = JsonKeySpec::parse("k").unwrap();
                let ours = !matches!(
                    extract_key(text.as_bytes(), &spec, &mut Vec::new()),
                    Err(JsonError::Invalid { .. } | JsonError::TooDeep { .. })
                );
                let theirs = serde_json::from_str::<Value>(&text).is_ok();
                prop_assert_eq!(ours, theirs, "{:?}", text);
            }
        }
    }

    /// extract_value reads the same fields as extract_key, stops after the target (so later
    /// garbage is not looked at) and still refuses what comes before it broken.
    #[test]
    fn extract_value_stops_at_the_target() {
        let mut scratch = Vec::new();
        let spec = JsonKeySpec::parse("/a/b").unwrap();
        for line in [&br#"{"a":{"b":12.5},"c":[1,2]}"#[..], br#"{"x":"y","a":{"z":1,"b":12.5}}"#] {
            assert_eq!(extract_value(line, &spec, &mut scratch).unwrap(), b"12.5");
            assert_eq!(extract_key(line, &spec, &mut scratch).unwrap(), b"12.5");
        }
        let line = br#"{"a":{"b":"x\u0041"},"c":tru"#;
        assert_eq!(extract_value(line, &spec, &mut scratch).unwrap(), b"xA");
        assert!(extract_key(line, &spec, &mut scratch).is_err(), "the full scan refuses it");
        assert!(extract_value(br#"{"a":{"q":tru,"b":1}}"#, &spec, &mut scratch).is_err());
        assert!(matches!(extract_value(br#"{"a":{"c":1}}"#, &spec, &mut scratch), Err(JsonError::KeyMissing)));
    }
}
