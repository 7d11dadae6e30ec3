//! What an aggregate is: its declaration, as `POST /streams/NAME/aggregates`
//! receives it, validated into typed parts.
//!
//! The JSON form (every field is listed by [`AggregateDeclaration::to_json`];
//! the ones with a default may be left out on input):
//!
//! ```json
//! {
//!   "name": "revenue-per-minute",
//!   "stream": "orders",
//!   "kind": "sum",
//!   "value": "json:/amount",
//!   "window": {"type": "tumbling", "size_ms": 60000},
//!   "time": "json:/ts",
//!   "allowed_lateness_ms": 5000,
//!   "late": "drop",
//!   "output": "revenue-per-minute"
//! }
//! ```
//!
//! * `name`: `[a-z0-9._-]{1,64}`, not `.` or `..` (it names checkpoint files
//!   and an HTTP path).
//! * `stream`, `output`: stream names (`[A-Za-z0-9_.-]{1,64}`). `output` is
//!   required for a windowed aggregate, absent for a running one (nothing
//!   ever closes), and never the input stream itself.
//! * `kind`: `count`, `sum`, `min`, `max`, `avg`, `last` (the value of the
//!   last event in offset order), `distinct-estimate` (HyperLogLog, about 3 %
//!   standard error: see `hll.rs`).
//! * `value`: absent (or `null`) for `count`, required otherwise:
//!   `json:<pointer>` (an RFC 6901 pointer such as `/order/amount`, or a
//!   top-level field name taken literally, as the JSON listener's key spec);
//!   `ilp:<field>` (an InfluxDB line protocol field); `number` (the whole
//!   payload is a decimal number); `payload` (the payload bytes themselves,
//!   `distinct-estimate` only). For numeric kinds a JSON value is a number,
//!   or a string holding one; an ILP value is a float, integer or unsigned
//!   field. For `distinct-estimate` the value's bytes are hashed: the JSON
//!   scalar as written (a string unescaped), the ILP field's typed value, the
//!   number's value, or the payload.
//! * `window`: `{"type": "none"}` (a running aggregate), `{"type":
//!   "tumbling", "size_ms": S}`, `{"type": "hopping", "size_ms": S, "step_ms":
//!   T}` (`"sliding"` is accepted as a synonym of `hopping` and listed back
//!   as `hopping`). Windows are aligned to the Unix epoch: a window starts at
//!   a multiple of its step (the size, for tumbling) and covers
//!   `[start, start + size)`. The step divides the size, so an event lies in
//!   exactly `size / step` windows.
//! * `time`: `arrival` (default: the time the engine applied the event's
//!   batch), `json:<pointer>` (the event's own time: an integer of
//!   milliseconds since the Unix epoch, or a string holding one, or an
//!   RFC 3339 string such as `2026-12-02T10:00:00.250Z`), or `ilp` (the
//!   line's timestamp; a line without one takes its arrival time, as
//!   InfluxDB does). A running aggregate has no time.
//! * `allowed_lateness_ms` (default 0): how far behind the largest event time
//!   seen an event may be and still count: windows close when the watermark
//!   (largest event time minus this) passes their end.
//! * `late` (default `drop`): what happens to an event whose every window
//!   has closed. `drop` counts it and skips it. Routing late events to a side
//!   stream is not built: it would be the same as an output stream, with the
//!   late event's offset as payload.
//!
//! Errors ([`DeclarationError`]) name the field and the value refused.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::aggregate::{
    AGGREGATE_NAME_SIZE_MAX, ALLOWED_LATENESS_MS_MAX, WINDOW_SIZE_MS_MAX, WINDOWS_PER_KEY_MAX, windows_per_key,
};
use crate::protocol::json::JsonKeySpec;
use crate::storage::dir::{STREAM_NAME_SIZE_MAX, check_stream_name};

/// Longest value or time source text (`json:` + pointer, `ilp:` + field).
pub const SOURCE_SIZE_MAX: usize = 1024;

/// One aggregate, validated. Built by [`AggregateDeclaration::from_json`]
/// (or serde), listed by [`AggregateDeclaration::to_json`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateDeclaration {
    pub name: String,
    pub stream: String,
    pub kind: AggregateKind,
    pub value: ValueSource,
    pub window: WindowSpec,
    pub time: TimeSource,
    pub allowed_lateness_ms: u64,
    pub late: LatePolicy,
    /// The stream closed windows are appended to (`None` for a running
    /// aggregate, which never closes a window).
    pub output: Option<String>,
}

/// What is computed per key and window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AggregateKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    /// The value of the last event, in offset order.
    Last,
    /// Estimated number of distinct values (HyperLogLog).
    DistinctEstimate,
}

/// Where an event's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// No value: `count`.
    None,
    /// A JSON payload's field, by pointer or top-level name.
    Json(JsonKeySpec),
    /// An InfluxDB line protocol payload's field (its unescaped name).
    Ilp(String),
    /// The whole payload as a decimal number.
    Number,
    /// The payload bytes (`distinct-estimate` only).
    Payload,
}

/// Which windows an aggregate keeps per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSpec {
    /// One running value per key, never closed.
    Running,
    /// Back-to-back windows of `size_ms`.
    Tumbling { size_ms: u64 },
    /// Windows of `size_ms` starting every `step_ms` (`step_ms` divides `size_ms`).
    Hopping { size_ms: u64, step_ms: u64 },
}

/// Where an event's time comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeSource {
    /// The batch's arrival time, given by the engine.
    Arrival,
    /// A JSON field: integer ms since the epoch, or RFC 3339.
    Json(JsonKeySpec),
    /// The ILP line's timestamp (ns, floored to ms), else the arrival time.
    Ilp,
}

/// What happens to an event whose windows have all closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatePolicy {
    /// Counted (`late_events_dropped`) and skipped.
    Drop,
}

/// Why a declaration was refused: each names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeclarationError {
    /// The body is not JSON (serde_json's message, with line and column).
    NotJson {
        detail: String,
    },
    /// The body is JSON but not an object.
    NotAnObject {
        found: &'static str,
    },
    UnknownField {
        field: String,
    },
    Missing {
        field: &'static str,
    },
    WrongType {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A name that is empty, too long or has a byte outside its charset.
    BadName {
        field: &'static str,
        value: String,
        size_max: usize,
        charset: &'static str,
    },
    BadKind {
        value: String,
    },
    /// A value or time source that does not parse.
    BadSource {
        field: &'static str,
        value: String,
        reason: String,
    },
    /// `count` takes no value; every other kind needs one.
    ValueNotAllowed {
        kind: &'static str,
        value: String,
    },
    ValueRequired {
        kind: &'static str,
    },
    /// `payload` is for `distinct-estimate` only.
    PayloadNotNumeric {
        kind: &'static str,
    },
    BadWindowType {
        value: String,
    },
    /// A window size or step outside `1..=WINDOW_SIZE_MS_MAX`.
    WindowOutOfRange {
        field: &'static str,
        value_ms: u64,
        value_ms_max: u64,
    },
    /// A window field given for a window type that has no such field.
    WindowFieldNotAllowed {
        field: &'static str,
        window_type: &'static str,
    },
    StepNotDivisor {
        size_ms: u64,
        step_ms: u64,
    },
    /// Open windows per key the declaration implies, over the limit.
    TooManyWindowsPerKey {
        windows_per_key: u64,
        windows_per_key_max: u64,
    },
    LatenessOutOfRange {
        allowed_lateness_ms: u64,
        allowed_lateness_ms_max: u64,
    },
    /// A running aggregate has no time, lateness or output.
    RunningHas {
        field: &'static str,
        value: String,
    },
    BadLatePolicy {
        value: String,
    },
    OutputRequired,
    OutputIsInput {
        stream: String,
    },
}

impl DeclarationError {
    /// The JSON field the error is about (`""` for the body as a whole).
    pub fn field(&self) -> &str {
        match self {
            DeclarationError::NotJson { .. } | DeclarationError::NotAnObject { .. } => "",
            DeclarationError::UnknownField { field } => field,
            DeclarationError::Missing { field }
            | DeclarationError::WrongType { field, .. }
            | DeclarationError::BadName { field, .. }
            | DeclarationError::BadSource { field, .. }
            | DeclarationError::WindowOutOfRange { field, .. }
            | DeclarationError::WindowFieldNotAllowed { field, .. }
            | DeclarationError::RunningHas { field, .. } => field,
            DeclarationError::BadKind { .. } => "kind",
            DeclarationError::ValueNotAllowed { .. }
            | DeclarationError::ValueRequired { .. }
            | DeclarationError::PayloadNotNumeric { .. } => "value",
            DeclarationError::BadWindowType { .. } => "window.type",
            DeclarationError::StepNotDivisor { .. } => "window.step_ms",
            DeclarationError::TooManyWindowsPerKey { .. } => "window",
            DeclarationError::LatenessOutOfRange { .. } => "allowed_lateness_ms",
            DeclarationError::BadLatePolicy { .. } => "late",
            DeclarationError::OutputRequired | DeclarationError::OutputIsInput { .. } => "output",
        }
    }
}

impl fmt::Display for DeclarationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DeclarationError as E;
        match self {
            E::NotJson { detail } => write!(f, "the declaration is not JSON: {detail}"),
            E::NotAnObject { found } => write!(f, "the declaration must be a JSON object, found {found}"),
            E::UnknownField { field } => write!(f, "{field}: unknown field"),
            E::Missing { field } => write!(f, "{field}: missing"),
            E::WrongType { field, value, expected } => write!(f, "{field}: {value} is not {expected}"),
            E::BadName { field, value, size_max, charset } => {
                write!(f, "{field}: {value:?} is not 1 to {size_max} of {charset} (and not . or ..)")
            }
            E::BadKind { value } => {
                write!(f, "kind: {value:?} is not one of count, sum, min, max, avg, last, distinct-estimate")
            }
            E::BadSource { field, value, reason } => write!(f, "{field}: {value:?}: {reason}"),
            E::ValueNotAllowed { kind, value } => write!(f, "value: {value:?} given, but {kind} takes no value"),
            E::ValueRequired { kind } => write!(f, "value: missing, {kind} needs json:, ilp:, number or payload"),
            E::PayloadNotNumeric { kind } => {
                write!(f, "value: \"payload\" is for distinct-estimate only, not {kind} (use number)")
            }
            E::BadWindowType { value } => {
                write!(f, "window.type: {value:?} is not one of none, tumbling, hopping, sliding")
            }
            E::WindowOutOfRange { field, value_ms, value_ms_max } => {
                write!(f, "{field}: {value_ms} is out of range 1..={value_ms_max}")
            }
            E::WindowFieldNotAllowed { field, window_type } => {
                write!(f, "{field}: not a field of a {window_type} window")
            }
            E::StepNotDivisor { size_ms, step_ms } => {
                write!(f, "window.step_ms: {step_ms} does not divide window.size_ms {size_ms}")
            }
            E::TooManyWindowsPerKey { windows_per_key, windows_per_key_max } => write!(
                f,
                "window: ceil((size_ms + allowed_lateness_ms) / step_ms) = {windows_per_key} open windows per key, \
                 limit {windows_per_key_max}"
            ),
            E::LatenessOutOfRange { allowed_lateness_ms, allowed_lateness_ms_max } => {
                write!(f, "allowed_lateness_ms: {allowed_lateness_ms} is over the limit {allowed_lateness_ms_max}")
            }
            E::RunningHas { field, value } => {
                write!(f, "{field}: {value} given, but a running aggregate (window none) has none")
            }
            E::BadLatePolicy { value } => {
                write!(f, "late: {value:?} is not drop (routing late events to a side stream is not built)")
            }
            E::OutputRequired => write!(f, "output: missing, a windowed aggregate appends closed windows to it"),
            E::OutputIsInput { stream } => {
                write!(f, "output: {stream:?} is the input stream (an aggregate would read its own output)")
            }
        }
    }
}

impl std::error::Error for DeclarationError {}

impl AggregateKind {
    /// The name used in declarations.
    pub fn as_str(self) -> &'static str {
        match self {
            AggregateKind::Count => "count",
            AggregateKind::Sum => "sum",
            AggregateKind::Min => "min",
            AggregateKind::Max => "max",
            AggregateKind::Avg => "avg",
            AggregateKind::Last => "last",
            AggregateKind::DistinctEstimate => "distinct-estimate",
        }
    }

    fn parse(text: &str) -> Option<AggregateKind> {
        const ALL: [AggregateKind; 7] = [
            AggregateKind::Count,
            AggregateKind::Sum,
            AggregateKind::Min,
            AggregateKind::Max,
            AggregateKind::Avg,
            AggregateKind::Last,
            AggregateKind::DistinctEstimate,
        ];
        ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

impl ValueSource {
    fn to_text(&self) -> Option<String> {
        match self {
            ValueSource::None => None,
            ValueSource::Json(spec) => Some(format!("json:{spec}")),
            ValueSource::Ilp(field) => Some(format!("ilp:{field}")),
            ValueSource::Number => Some("number".to_string()),
            ValueSource::Payload => Some("payload".to_string()),
        }
    }

    fn parse(text: &str) -> Result<ValueSource, String> {
        if let Some(pointer) = text.strip_prefix("json:") {
            return JsonKeySpec::parse(pointer).map(ValueSource::Json).map_err(|error| error.to_string());
        }
        if let Some(field) = text.strip_prefix("ilp:") {
            if field.is_empty() {
                return Err("empty ILP field name".to_string());
            }
            return Ok(ValueSource::Ilp(field.to_string()));
        }
        match text {
            "number" => Ok(ValueSource::Number),
            "payload" => Ok(ValueSource::Payload),
            _ => Err("not json:<pointer>, ilp:<field>, number or payload".to_string()),
        }
    }
}

impl TimeSource {
    fn to_text(&self) -> String {
        match self {
            TimeSource::Arrival => "arrival".to_string(),
            TimeSource::Json(spec) => format!("json:{spec}"),
            TimeSource::Ilp => "ilp".to_string(),
        }
    }

    fn parse(text: &str) -> Result<TimeSource, String> {
        if let Some(pointer) = text.strip_prefix("json:") {
            return JsonKeySpec::parse(pointer).map(TimeSource::Json).map_err(|error| error.to_string());
        }
        match text {
            "arrival" => Ok(TimeSource::Arrival),
            "ilp" => Ok(TimeSource::Ilp),
            _ => Err("not arrival, json:<pointer> or ilp".to_string()),
        }
    }
}

impl WindowSpec {
    /// `(size_ms, step_ms)` of a windowed spec, `None` when running.
    pub fn size_and_step_ms(self) -> Option<(u64, u64)> {
        match self {
            WindowSpec::Running => None,
            WindowSpec::Tumbling { size_ms } => Some((size_ms, size_ms)),
            WindowSpec::Hopping { size_ms, step_ms } => Some((size_ms, step_ms)),
        }
    }

    fn to_value(self) -> Value {
        match self {
            WindowSpec::Running => serde_json::json!({"type": "none"}),
            WindowSpec::Tumbling { size_ms } => serde_json::json!({"type": "tumbling", "size_ms": size_ms}),
            WindowSpec::Hopping { size_ms, step_ms } => {
                serde_json::json!({"type": "hopping", "size_ms": size_ms, "step_ms": step_ms})
            }
        }
    }
}

/// A short description of a JSON value for error messages (at most ~80 bytes).
fn describe(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 80 {
        let mut cut = 77;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The fields of one JSON object, taken one by one so that every field left
/// over at the end is unknown.
struct Fields {
    map: Map<String, Value>,
    /// Prefix of field names in errors (`""` or `"window."`).
    prefix: &'static str,
}

impl Fields {
    fn take(&mut self, field: &'static str) -> Option<Value> {
        self.map.remove(field).filter(|value| !value.is_null())
    }

    fn string(&mut self, field: &'static str) -> Result<Option<String>, DeclarationError> {
        match self.take(field) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(other) => Err(DeclarationError::WrongType { field, value: describe(&other), expected: "a string" }),
        }
    }

    fn required_string(&mut self, field: &'static str) -> Result<String, DeclarationError> {
        self.string(field)?.ok_or(DeclarationError::Missing { field })
    }

    fn integer(&mut self, field: &'static str) -> Result<Option<u64>, DeclarationError> {
        match self.take(field) {
            None => Ok(None),
            Some(value) => value.as_u64().map(Some).ok_or_else(|| DeclarationError::WrongType {
                field,
                value: describe(&value),
                expected: "a non-negative integer",
            }),
        }
    }

    fn finish(self) -> Result<(), DeclarationError> {
        match self.map.into_iter().next() {
            None => Ok(()),
            Some((field, _)) => Err(DeclarationError::UnknownField { field: format!("{}{field}", self.prefix) }),
        }
    }
}

fn check_aggregate_name(name: &str) -> Result<(), DeclarationError> {
    let allowed = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || matches!(byte, b'.' | b'_' | b'-');
    let ok = !name.is_empty()
        && name.len() <= AGGREGATE_NAME_SIZE_MAX
        && name != "."
        && name != ".."
        && name.bytes().all(allowed);
    if ok {
        return Ok(());
    }
    Err(DeclarationError::BadName {
        field: "name",
        value: name.to_string(),
        size_max: AGGREGATE_NAME_SIZE_MAX,
        charset: "[a-z0-9._-]",
    })
}

fn check_stream(field: &'static str, stream: &str) -> Result<(), DeclarationError> {
    check_stream_name(stream).map_err(|_| DeclarationError::BadName {
        field,
        value: stream.to_string(),
        size_max: STREAM_NAME_SIZE_MAX,
        charset: "[A-Za-z0-9_.-]",
    })
}

fn parse_window(value: Value) -> Result<WindowSpec, DeclarationError> {
    let Value::Object(map) = value else {
        return Err(DeclarationError::WrongType {
            field: "window",
            value: describe(&value),
            expected: "an object like {\"type\": \"tumbling\", \"size_ms\": 60000}",
        });
    };
    let mut fields = Fields { map, prefix: "window." };
    let window_type = fields.required_string("type").map_err(|error| match error {
        DeclarationError::Missing { .. } => DeclarationError::Missing { field: "window.type" },
        DeclarationError::WrongType { value, expected, .. } => {
            DeclarationError::WrongType { field: "window.type", value, expected }
        }
        other => other,
    })?;
    let in_range = |field: &'static str, value_ms: Option<u64>| -> Result<u64, DeclarationError> {
        let value_ms = value_ms.ok_or(DeclarationError::Missing { field })?;
        if value_ms == 0 || value_ms > WINDOW_SIZE_MS_MAX {
            return Err(DeclarationError::WindowOutOfRange { field, value_ms, value_ms_max: WINDOW_SIZE_MS_MAX });
        }
        Ok(value_ms)
    };
    let size_ms = fields.integer("size_ms").map_err(|error| rename(error, "window.size_ms"))?;
    let step_ms = fields.integer("step_ms").map_err(|error| rename(error, "window.step_ms"))?;
    let spec = match window_type.as_str() {
        "none" => {
            not_allowed("window.size_ms", size_ms, "none")?;
            not_allowed("window.step_ms", step_ms, "none")?;
            WindowSpec::Running
        }
        "tumbling" => {
            not_allowed("window.step_ms", step_ms, "tumbling")?;
            WindowSpec::Tumbling { size_ms: in_range("window.size_ms", size_ms)? }
        }
        "hopping" | "sliding" => {
            let size_ms = in_range("window.size_ms", size_ms)?;
            let step_ms = in_range("window.step_ms", step_ms)?;
            if step_ms > size_ms || !size_ms.is_multiple_of(step_ms) {
                return Err(DeclarationError::StepNotDivisor { size_ms, step_ms });
            }
            WindowSpec::Hopping { size_ms, step_ms }
        }
        _ => return Err(DeclarationError::BadWindowType { value: window_type }),
    };
    fields.finish()?;
    Ok(spec)
}

fn rename(error: DeclarationError, field: &'static str) -> DeclarationError {
    match error {
        DeclarationError::WrongType { value, expected, .. } => DeclarationError::WrongType { field, value, expected },
        other => other,
    }
}

fn not_allowed(field: &'static str, value: Option<u64>, window_type: &'static str) -> Result<(), DeclarationError> {
    match value {
        None => Ok(()),
        Some(_) => Err(DeclarationError::WindowFieldNotAllowed { field, window_type }),
    }
}

fn parse_value_source(kind: AggregateKind, text: Option<String>) -> Result<ValueSource, DeclarationError> {
    let value = match (kind, text) {
        (AggregateKind::Count, None) => return Ok(ValueSource::None),
        (AggregateKind::Count, Some(text)) => {
            return Err(DeclarationError::ValueNotAllowed { kind: kind.as_str(), value: text });
        }
        (_, None) => return Err(DeclarationError::ValueRequired { kind: kind.as_str() }),
        (_, Some(text)) => text,
    };
    if value.len() > SOURCE_SIZE_MAX {
        let reason = format!("longer than {SOURCE_SIZE_MAX} bytes");
        return Err(DeclarationError::BadSource { field: "value", value, reason });
    }
    let source =
        ValueSource::parse(&value).map_err(|reason| DeclarationError::BadSource { field: "value", value, reason })?;
    if source == ValueSource::Payload && kind != AggregateKind::DistinctEstimate {
        return Err(DeclarationError::PayloadNotNumeric { kind: kind.as_str() });
    }
    Ok(source)
}

fn parse_time_source(text: Option<String>) -> Result<TimeSource, DeclarationError> {
    let Some(text) = text else { return Ok(TimeSource::Arrival) };
    if text.len() > SOURCE_SIZE_MAX {
        let reason = format!("longer than {SOURCE_SIZE_MAX} bytes");
        return Err(DeclarationError::BadSource { field: "time", value: text, reason });
    }
    TimeSource::parse(&text).map_err(|reason| DeclarationError::BadSource { field: "time", value: text, reason })
}

impl AggregateDeclaration {
    /// Parses and validates a declaration (the body of
    /// `POST /streams/NAME/aggregates`; the engine checks that `stream`
    /// matches NAME, and that `name` is not taken).
    pub fn from_json(body: &[u8]) -> Result<AggregateDeclaration, DeclarationError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|error| DeclarationError::NotJson { detail: error.to_string() })?;
        AggregateDeclaration::from_value(value)
    }

    /// Validates a parsed JSON value.
    pub fn from_value(value: Value) -> Result<AggregateDeclaration, DeclarationError> {
        let Value::Object(map) = value else {
            return Err(DeclarationError::NotAnObject { found: type_name(&value) });
        };
        let mut fields = Fields { map, prefix: "" };
        let name = fields.required_string("name")?;
        check_aggregate_name(&name)?;
        let stream = fields.required_string("stream")?;
        check_stream("stream", &stream)?;
        let kind_text = fields.required_string("kind")?;
        let kind = AggregateKind::parse(&kind_text).ok_or(DeclarationError::BadKind { value: kind_text })?;
        let value = parse_value_source(kind, fields.string("value")?)?;
        let window = parse_window(fields.take("window").ok_or(DeclarationError::Missing { field: "window" })?)?;
        let time_text = fields.string("time")?;
        let lateness = fields.integer("allowed_lateness_ms")?;
        let late = match fields.string("late")?.as_deref() {
            None | Some("drop") => LatePolicy::Drop,
            Some(other) => return Err(DeclarationError::BadLatePolicy { value: other.to_string() }),
        };
        let output = fields.string("output")?;
        fields.finish()?;
        if window == WindowSpec::Running {
            running_has("time", time_text.as_ref().filter(|text| *text != "arrival").map(|text| format!("{text:?}")))?;
            running_has("allowed_lateness_ms", lateness.filter(|&ms| ms > 0).map(|ms| ms.to_string()))?;
            running_has("output", output.as_ref().map(|text| format!("{text:?}")))?;
        }
        let time = parse_time_source(time_text)?;
        let allowed_lateness_ms = lateness.unwrap_or(0);
        check_limits(window, allowed_lateness_ms)?;
        if let Some(output) = &output {
            check_stream("output", output)?;
            if *output == stream {
                return Err(DeclarationError::OutputIsInput { stream });
            }
        } else if window != WindowSpec::Running {
            return Err(DeclarationError::OutputRequired);
        }
        Ok(AggregateDeclaration { name, stream, kind, value, window, time, allowed_lateness_ms, late, output })
    }

    /// The canonical JSON form, every field listed (what `GET` lists and
    /// what a checkpoint stores).
    pub fn to_value(&self) -> Value {
        let mut map = Map::new();
        map.insert("name".into(), Value::String(self.name.clone()));
        map.insert("stream".into(), Value::String(self.stream.clone()));
        map.insert("kind".into(), Value::String(self.kind.as_str().into()));
        map.insert("value".into(), self.value.to_text().map_or(Value::Null, Value::String));
        map.insert("window".into(), self.window.to_value());
        map.insert("time".into(), Value::String(self.time.to_text()));
        map.insert("allowed_lateness_ms".into(), Value::from(self.allowed_lateness_ms));
        map.insert("late".into(), Value::String("drop".into()));
        map.insert("output".into(), self.output.clone().map_or(Value::Null, Value::String));
        Value::Object(map)
    }

    /// [`AggregateDeclaration::to_value`] as compact JSON text.
    pub fn to_json(&self) -> String {
        self.to_value().to_string()
    }

    /// Open windows per key this declaration can hold at once (1 when running).
    pub fn windows_per_key_max(&self) -> u64 {
        match self.window.size_and_step_ms() {
            None => 1,
            Some((size_ms, step_ms)) => windows_per_key(size_ms, step_ms, self.allowed_lateness_ms),
        }
    }
}

fn running_has(field: &'static str, value: Option<String>) -> Result<(), DeclarationError> {
    match value {
        None => Ok(()),
        Some(value) => Err(DeclarationError::RunningHas { field, value }),
    }
}

fn check_limits(window: WindowSpec, allowed_lateness_ms: u64) -> Result<(), DeclarationError> {
    if allowed_lateness_ms > ALLOWED_LATENESS_MS_MAX {
        return Err(DeclarationError::LatenessOutOfRange {
            allowed_lateness_ms,
            allowed_lateness_ms_max: ALLOWED_LATENESS_MS_MAX,
        });
    }
    if let Some((size_ms, step_ms)) = window.size_and_step_ms() {
        let windows = windows_per_key(size_ms, step_ms, allowed_lateness_ms);
        if windows > WINDOWS_PER_KEY_MAX as u64 {
            return Err(DeclarationError::TooManyWindowsPerKey {
                windows_per_key: windows,
                windows_per_key_max: WINDOWS_PER_KEY_MAX as u64,
            });
        }
    }
    Ok(())
}

impl Serialize for AggregateDeclaration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for AggregateDeclaration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        AggregateDeclaration::from_value(value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AggregateDeclaration, DeclarationError> {
        AggregateDeclaration::from_json(text.as_bytes())
    }

    const EXAMPLE: &str = r#"{"name":"revenue-per-minute","stream":"orders","kind":"sum","value":"json:/amount",
        "window":{"type":"tumbling","size_ms":60000},"time":"json:/ts","allowed_lateness_ms":5000,
        "late":"drop","output":"revenue-per-minute"}"#;

    /// The module doc's example parses into the typed parts it shows.
    #[test]
    fn example_parses() {
        let declaration = parse(EXAMPLE).unwrap();
        assert_eq!(declaration.name, "revenue-per-minute");
        assert_eq!(declaration.kind, AggregateKind::Sum);
        assert_eq!(declaration.value, ValueSource::Json(JsonKeySpec::parse("/amount").unwrap()));
        assert_eq!(declaration.window, WindowSpec::Tumbling { size_ms: 60_000 });
        assert_eq!(declaration.time, TimeSource::Json(JsonKeySpec::parse("/ts").unwrap()));
        assert_eq!(declaration.allowed_lateness_ms, 5000);
        assert_eq!(declaration.output.as_deref(), Some("revenue-per-minute"));
        assert_eq!(declaration.windows_per_key_max(), 2);
    }

    /// Listing a declaration and parsing the listing gives it back, for every kind of source and window.
    #[test]
    fn round_trips_through_json() {
        let bodies = [
            EXAMPLE,
            r#"{"name":"n","stream":"s","kind":"count","window":{"type":"none"}}"#,
            r#"{"name":"a.b_c-1","stream":"s","kind":"distinct-estimate","value":"payload",
                "window":{"type":"sliding","size_ms":600,"step_ms":100},"output":"o"}"#,
            r#"{"name":"m","stream":"cpu","kind":"max","value":"ilp:usage user","time":"ilp",
                "window":{"type":"hopping","size_ms":10,"step_ms":5},"output":"o"}"#,
            r#"{"name":"l","stream":"s","kind":"last","value":"number","window":{"type":"none"},"time":"arrival"}"#,
        ];
        for body in bodies {
            let declaration = parse(body).unwrap_or_else(|error| panic!("{body}: {error}"));
            let listed = declaration.to_json();
            assert_eq!(parse(&listed).unwrap(), declaration, "{listed}");
            let via_serde: AggregateDeclaration = serde_json::from_str(&listed).unwrap();
            assert_eq!(via_serde, declaration);
        }
    }

    /// Every refusal names the field it is about and carries the refused value.
    #[test]
    fn errors_name_field_and_value() {
        let cases: [(&str, &str, &str); 20] = [
            (r#"[1]"#, "", "an array"),
            (r#"{"stream":"s"}"#, "name", "missing"),
            (r#"{"name":"Bad Name","stream":"s"}"#, "name", "Bad Name"),
            (r#"{"name":"n","stream":"a/b"}"#, "stream", "a/b"),
            (r#"{"name":"n","stream":"s","kind":"median"}"#, "kind", "median"),
            (r#"{"name":"n","stream":"s","kind":"count","value":"number"}"#, "value", "number"),
            (r#"{"name":"n","stream":"s","kind":"sum"}"#, "value", "sum"),
            (r#"{"name":"n","stream":"s","kind":"sum","value":"xml:/a"}"#, "value", "xml:/a"),
            (r#"{"name":"n","stream":"s","kind":"sum","value":"json:/a~2"}"#, "value", "json:/a~2"),
            (r#"{"name":"n","stream":"s","kind":"sum","value":"payload"}"#, "value", "payload"),
            (r#"{"name":"n","stream":"s","kind":"count","window":{"type":"weekly"}}"#, "window.type", "weekly"),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":0},"output":"o"}"#,
                "window.size_ms",
                "0",
            ),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"hopping","size_ms":10,"step_ms":3}}"#,
                "window.step_ms",
                "3",
            ),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":"1s"}}"#,
                "window.size_ms",
                "1s",
            ),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"hopping","size_ms":1000,"step_ms":1}}"#,
                "window",
                "1000",
            ),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":10},"colour":1}"#,
                "colour",
                "unknown",
            ),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":10}}"#,
                "output",
                "missing",
            ),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":10},"output":"s"}"#,
                "output",
                "\"s\"",
            ),
            (r#"{"name":"n","stream":"s","kind":"count","window":{"type":"none"},"time":"ilp"}"#, "time", "ilp"),
            (
                r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":10},"late":"side"}"#,
                "late",
                "side",
            ),
        ];
        for (body, field, fragment) in cases {
            let error = parse(body).expect_err(body);
            assert_eq!(error.field(), field, "{body}: {error}");
            let text = error.to_string();
            assert!(text.contains(fragment), "{body}: {text:?} lacks {fragment:?}");
            assert!(field.is_empty() || text.starts_with(field), "{text}");
        }
    }

    /// The lateness limit and the windows-per-key limit are enforced with their numbers.
    #[test]
    fn limits_are_enforced() {
        let body = |lateness: u64| {
            format!(
                r#"{{"name":"n","stream":"s","kind":"count","window":{{"type":"tumbling","size_ms":1000}},
                   "allowed_lateness_ms":{lateness},"output":"o"}}"#
            )
        };
        let windows = WINDOWS_PER_KEY_MAX as u64;
        assert!(parse(&body((windows - 1) * 1000)).is_ok());
        let error = parse(&body(windows * 1000)).unwrap_err();
        assert_eq!(
            error,
            DeclarationError::TooManyWindowsPerKey { windows_per_key: windows + 1, windows_per_key_max: windows }
        );
        let error = parse(&body(ALLOWED_LATENESS_MS_MAX + 1)).unwrap_err();
        assert!(matches!(error, DeclarationError::LatenessOutOfRange { .. }), "{error}");
        let long_name =
            format!(r#"{{"name":"{}","stream":"s","kind":"count","window":{{"type":"none"}}}}"#, "a".repeat(65));
        assert!(matches!(parse(&long_name).unwrap_err(), DeclarationError::BadName { size_max: 64, .. }));
    }

    /// Window sizes, steps and lateness near u64::MAX (u64::MAX, 2^63) are
    /// refused by field before any sum of them (size + lateness, start +
    /// size) is computed, so no declaration can make window arithmetic wrap;
    /// the largest accepted ones stay far from it.
    #[test]
    fn huge_windows_and_lateness_are_refused_before_any_sum() {
        for huge in [u64::MAX, 1 << 63, WINDOW_SIZE_MS_MAX + 1] {
            let cases = [
                (format!(r#"{{"type":"tumbling","size_ms":{huge}}}"#), 0, "window.size_ms"),
                (format!(r#"{{"type":"hopping","size_ms":{huge},"step_ms":{huge}}}"#), 0, "window.size_ms"),
                (format!(r#"{{"type":"hopping","size_ms":1000,"step_ms":{huge}}}"#), 0, "window.step_ms"),
                (r#"{"type":"tumbling","size_ms":1000}"#.to_string(), huge, "allowed_lateness_ms"),
            ];
            for (window, lateness, field) in cases {
                let body = format!(
                    r#"{{"name":"n","stream":"s","kind":"count","window":{window},"allowed_lateness_ms":{lateness},
                       "output":"o"}}"#
                );
                let error = parse(&body).expect_err(&body);
                assert_eq!(error.field(), field, "{body}: {error}");
            }
        }
        let widest = format!(
            r#"{{"name":"n","stream":"s","kind":"count","window":{{"type":"tumbling","size_ms":{WINDOW_SIZE_MS_MAX}}},
               "allowed_lateness_ms":{ALLOWED_LATENESS_MS_MAX},"output":"o"}}"#
        );
        let declaration = parse(&widest).unwrap();
        assert_eq!(declaration.windows_per_key_max(), 2);
        let last_end_ms = crate::aggregate::TIME_MS_MAX + WINDOW_SIZE_MS_MAX + ALLOWED_LATENESS_MS_MAX;
        assert!(last_end_ms < u64::MAX / 2, "the latest window end and its lateness fit with room");
    }
}
