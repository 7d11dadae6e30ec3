//! Reading an event's value and time out of its payload, with the engine's
//! own parsers ([`crate::protocol::json`], [`crate::protocol::ilp`]) and no
//! allocation: JSON scalars that need unescaping go into a reused scratch.
//!
//! Every function here returns `None` for a value that is missing or
//! malformed; the caller counts it and skips the event for that aggregate.
//! A JSON payload is scanned only up to the value
//! ([`crate::protocol::json::extract_value`]): what follows it is not
//! validated (the JSON listener validated it on ingest; a line-protocol
//! payload that is JSON up to the field still gives its value).

use xxhash_rust::xxh3::xxh3_64;

use crate::aggregate::TIME_MS_MAX;
use crate::aggregate::declaration::{TimeSource, ValueSource};
use crate::protocol::ilp::{self, FieldValue};
use crate::protocol::json::{extract_value, extract_value_at};

/// What one event contributes to an aggregate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Input {
    /// `count`: nothing but the event itself.
    Unit,
    /// A finite number.
    Number(f64),
    /// The 64-bit hash of the value (`distinct-estimate`).
    Hash(u64),
}

/// The event's time in ms since the Unix epoch, or `None` when its source
/// holds no valid time (before the epoch or after year 9999 included).
#[inline]
pub(crate) fn event_time_ms(
    source: &TimeSource,
    payload: &[u8],
    arrival_ms: u64,
    scratch: &mut Vec<u8>,
) -> Option<u64> {
    let time_ms = match source {
        TimeSource::Arrival => arrival_ms,
        TimeSource::Json(spec) => {
            let text = extract_value(payload, spec, scratch).ok()?;
            parse_time_text(text)?
        }
        TimeSource::Ilp => match ilp::timestamp_ns(payload) {
            None => arrival_ms,
            Some(ns) if ns >= 0 => (ns / 1_000_000) as u64,
            Some(_) => return None,
        },
    };
    (time_ms <= TIME_MS_MAX).then_some(time_ms)
}

/// Integer milliseconds, or an RFC 3339 date-time.
fn parse_time_text(text: &[u8]) -> Option<u64> {
    if text.first().is_some_and(u8::is_ascii_digit) && text.iter().all(u8::is_ascii_digit) {
        return parse_u64(text);
    }
    parse_rfc3339_ms(text)
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |total, &digit| digit.is_ascii_digit().then(|| total * 10 + u64::from(digit - b'0')))
}

/// The value numeric kinds read: `Some` only for a finite number.
/// `value_at` is the JSON listener's hint of where a JSON value starts
/// ([`crate::protocol::record::RecordRef::value_at`], 0: none).
#[inline]
pub(crate) fn number(source: &ValueSource, payload: &[u8], value_at: u16, scratch: &mut Vec<u8>) -> Option<f64> {
    let value = match source {
        ValueSource::Json(spec) => parse_f64(extract_value_at(payload, spec, value_at, scratch).ok()?)?,
        ValueSource::Ilp(field) => match ilp::field_value(payload, field.as_bytes())? {
            FieldValue::Float(value) => value,
            FieldValue::Integer(value) => value as f64,
            FieldValue::Unsigned(value) => value as f64,
            _ => return None,
        },
        ValueSource::Number => parse_f64(payload.trim_ascii())?,
        ValueSource::None | ValueSource::Payload => return None,
    };
    value.is_finite().then_some(value)
}

/// A number's text as `f64`. Integers of up to 15 digits (most values
/// events carry) are read directly, exactly as the full parser would read
/// them (below 2^53 every integer is exact, and `-0` is `-0.0`); anything
/// else goes to Rust's parser, which also reads "inf" and "NaN": the
/// caller keeps finite values only.
#[inline]
fn parse_f64(text: &[u8]) -> Option<f64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if !digits.is_empty() && digits.len() <= 15 && digits.iter().all(u8::is_ascii_digit) {
        let integer = digits.iter().fold(0u64, |total, &digit| total * 10 + u64::from(digit - b'0')) as f64;
        return Some(if negative { -integer } else { integer });
    }
    std::str::from_utf8(text).ok()?.parse::<f64>().ok()
}

/// The hash `distinct-estimate` counts: xxh3 (seed 0, stable across
/// processes, as checkpoints need) of the value's bytes.
#[inline]
pub(crate) fn value_hash(source: &ValueSource, payload: &[u8], value_at: u16, scratch: &mut Vec<u8>) -> Option<u64> {
    match source {
        ValueSource::Json(spec) => Some(xxh3_64(extract_value_at(payload, spec, value_at, scratch).ok()?)),
        ValueSource::Ilp(field) => Some(field_hash(ilp::field_value(payload, field.as_bytes())?)),
        ValueSource::Number => number(source, payload, 0, scratch).map(number_hash),
        ValueSource::Payload => Some(xxh3_64(payload)),
        ValueSource::None => None,
    }
}

/// Equal numbers hash equal whatever their text (`1`, `1.0`, `-0`).
fn number_hash(value: f64) -> u64 {
    let value = if value == 0.0 { 0.0 } else { value };
    xxh3_64(&value.to_bits().to_le_bytes())
}

fn field_hash(value: FieldValue<'_>) -> u64 {
    let mut bytes = [0u8; 9];
    let tagged = |tag: u8, payload: [u8; 8], bytes: &mut [u8; 9]| {
        bytes[0] = tag;
        bytes[1..].copy_from_slice(&payload);
        xxh3_64(bytes)
    };
    match value {
        FieldValue::Float(value) => number_hash(value),
        FieldValue::Integer(value) => number_hash(value as f64),
        FieldValue::Unsigned(value) => number_hash(value as f64),
        FieldValue::Boolean(value) => tagged(b'b', u64::from(value).to_le_bytes(), &mut bytes),
        FieldValue::TimestampMicros(value) => tagged(b't', value.to_le_bytes(), &mut bytes),
        // Strings and long256 hash as written; escapes are rare in values.
        FieldValue::String(text) => xxh3_64(text.raw()),
        FieldValue::Long256(digits) => xxh3_64(digits),
    }
}

/// Parses `YYYY-MM-DD(T|t| )HH:MM:SS[.fraction](Z|z|+HH:MM|-HH:MM)` into
/// ms since the Unix epoch (fraction truncated to ms; a leap second `:60`
/// reads as `:59.999`). `None` for anything else or a time before 1970.
pub(crate) fn parse_rfc3339_ms(text: &[u8]) -> Option<u64> {
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = text.get(range)?;
        digits
            .iter()
            .try_fold(0i64, |total, &digit| digit.is_ascii_digit().then(|| total * 10 + i64::from(digit - b'0')))
    };
    let separators_ok = text.get(4) == Some(&b'-')
        && text.get(7) == Some(&b'-')
        && matches!(text.get(10), Some(b'T' | b't' | b' '))
        && text.get(13) == Some(&b':')
        && text.get(16) == Some(&b':');
    if !separators_ok {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let date_ok = (1..=12).contains(&month) && day >= 1 && day <= days_in_month(year, month);
    if !date_ok || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut position = 19;
    let mut millis = 0i64;
    if text.get(position) == Some(&b'.') {
        let digits_start = position + 1;
        position = digits_start;
        while text.get(position).is_some_and(u8::is_ascii_digit) {
            if position - digits_start < 3 {
                millis = millis * 10 + i64::from(text[position] - b'0');
            }
            position += 1;
        }
        let digit_count = position - digits_start;
        if digit_count == 0 {
            return None;
        }
        for _ in digit_count..3 {
            millis *= 10;
        }
    }
    let (second, millis) = if second == 60 { (59, 999) } else { (second, millis) };
    let offset_minutes = match text.get(position..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), rest @ ..] if rest.len() == 5 && rest[2] == b':' => {
            let (hours, minutes) = (number(position + 1..position + 3)?, number(position + 4..position + 6)?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            let total = hours * 60 + minutes;
            if *sign == b'+' { total } else { -total }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    let ms = seconds.checked_mul(1000)?.checked_add(millis)?;
    u64::try_from(ms).ok()
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integer fast path reads exactly what Rust's parser reads.
    #[test]
    fn integers_parse_as_the_full_parser_does() {
        for text in [
            "0",
            "-0",
            "7",
            "-42",
            "999999999999999",
            "-999999999999999",
            "1234567890123456",
            "+5",
            "5.",
            "1e3",
            "--1",
            "-",
            "",
        ] {
            let expected = std::str::from_utf8(text.as_bytes()).unwrap().parse::<f64>().ok();
            let found = parse_f64(text.as_bytes());
            assert_eq!(found.map(f64::to_bits), expected.map(f64::to_bits), "{text:?}");
        }
    }
    use crate::protocol::json::JsonKeySpec;

    fn json(pointer: &str) -> ValueSource {
        ValueSource::Json(JsonKeySpec::parse(pointer).unwrap())
    }

    /// RFC 3339 times read as the ms the standard says, offsets and fractions included; bad ones are refused.
    #[test]
    fn rfc3339_times() {
        let cases: [(&str, Option<u64>); 12] = [
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2026-12-02T10:00:00.250Z", Some(1_796_205_600_250)),
            ("2026-12-02t10:00:00.2509z", Some(1_796_205_600_250)),
            ("2026-12-02 12:00:00.25+02:00", Some(1_796_205_600_250)),
            ("2026-12-02T05:30:00-04:30", Some(1_796_205_600_000)),
            ("2000-02-29T00:00:00Z", Some(951_782_400_000)),
            ("2016-12-31T23:59:60Z", Some(1_483_228_799_999)),
            ("2001-02-29T00:00:00Z", None),
            ("1969-12-31T23:59:59Z", None),
            ("2026-12-02T10:00:00", None),
            ("2026-12-02T10:00:00.Z", None),
            ("2026-13-02T10:00:00Z", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_rfc3339_ms(text.as_bytes()), expected, "{text}");
        }
    }

    /// Event times come from JSON (ms or RFC 3339), ILP (ns floored, arrival when absent) or arrival.
    #[test]
    fn event_times() {
        let mut scratch = Vec::new();
        let ts = TimeSource::Json(JsonKeySpec::parse("/ts").unwrap());
        let time = |source: &TimeSource, payload: &str, scratch: &mut Vec<u8>| {
            event_time_ms(source, payload.as_bytes(), 777, scratch)
        };
        assert_eq!(time(&ts, r#"{"ts":1700000000123}"#, &mut scratch), Some(1_700_000_000_123));
        assert_eq!(time(&ts, r#"{"ts":"1970-01-01T00:00:01.5Z"}"#, &mut scratch), Some(1500));
        assert_eq!(time(&ts, r#"{"ts":"17000"}"#, &mut scratch), Some(17_000));
        assert_eq!(time(&ts, r#"{"ts":-1}"#, &mut scratch), None);
        assert_eq!(time(&ts, r#"{"ts":1.5}"#, &mut scratch), None);
        assert_eq!(time(&ts, r#"{"other":1}"#, &mut scratch), None);
        assert_eq!(time(&ts, r#"{"ts":99999999999999999}"#, &mut scratch), None, "past year 9999");
        assert_eq!(time(&TimeSource::Ilp, "cpu v=1 1700000000123999999", &mut scratch), Some(1_700_000_000_123));
        assert_eq!(time(&TimeSource::Ilp, "cpu v=1", &mut scratch), Some(777));
        assert_eq!(time(&TimeSource::Ilp, "cpu v=1 -5", &mut scratch), None);
        assert_eq!(time(&TimeSource::Arrival, "anything", &mut scratch), Some(777));
    }

    /// Numbers come from JSON numbers or numeric strings, ILP numeric fields and plain payloads; others are refused.
    #[test]
    fn numbers() {
        let mut scratch = Vec::new();
        let mut value = |source: &ValueSource, payload: &str| number(source, payload.as_bytes(), 0, &mut scratch);
        assert_eq!(value(&json("/a/b"), r#"{"a":{"b":12.5}}"#), Some(12.5));
        assert_eq!(value(&json("amount"), r#"{"amount":"7"}"#), Some(7.0));
        assert_eq!(value(&json("amount"), r#"{"amount":true}"#), None);
        assert_eq!(value(&json("amount"), r#"{"amount":null}"#), None);
        assert_eq!(value(&json("amount"), r#"{"amount":1e999}"#), None, "not finite");
        assert_eq!(value(&json("amount"), r#"{"amount":1,}"#), Some(1.0), "bytes after the value are not read");
        assert_eq!(value(&json("amount"), r#"{"x":tru,"amount":1}"#), None, "invalid JSON before it");
        assert_eq!(value(&ValueSource::Ilp("u".into()), "cpu u=3i,v=2 1"), Some(3.0));
        assert_eq!(value(&ValueSource::Ilp("v".into()), "cpu u=3i,v=2.5"), Some(2.5));
        assert_eq!(value(&ValueSource::Ilp("s".into()), r#"cpu s="x""#), None);
        assert_eq!(value(&ValueSource::Ilp("w".into()), "cpu u=3i"), None);
        assert_eq!(value(&ValueSource::Number, " 42.5\r"), Some(42.5));
        assert_eq!(value(&ValueSource::Number, "inf"), None);
        assert_eq!(value(&ValueSource::Number, "12 apples"), None);
    }

    /// Equal values hash equal across spellings where the doc says so, and different values differ.
    #[test]
    fn hashes() {
        let mut scratch = Vec::new();
        let mut hash = |source: &ValueSource, payload: &str| value_hash(source, payload.as_bytes(), 0, &mut scratch);
        assert_eq!(hash(&json("u"), r#"{"u":"a\u0062"}"#), hash(&json("u"), r#"{"u":"ab"}"#));
        assert_ne!(hash(&json("u"), r#"{"u":"ab"}"#), hash(&json("u"), r#"{"u":"ac"}"#));
        assert_eq!(hash(&ValueSource::Number, "1"), hash(&ValueSource::Number, "1.0"));
        assert_eq!(hash(&ValueSource::Ilp("v".into()), "m v=1i"), hash(&ValueSource::Ilp("v".into()), "m v=1"));
        assert_eq!(hash(&ValueSource::Payload, "user7"), Some(xxh3_64(b"user7")));
        assert_eq!(hash(&json("u"), r#"{"v":1}"#), None);
    }
}
