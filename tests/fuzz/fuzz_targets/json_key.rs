//! Fuzzes `spate::protocol::json::extract_key` differentially against
//! serde_json: a line is valid for spate exactly when serde_json parses it
//! (up to the two documented differences below), and the key spate extracts
//! is what `serde_json::Value::pointer` finds there.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use spate::protocol::json::{JsonError, JsonKeySpec, extract_key};

/// The first input byte picks one of these key specs.
const SPECS: [&str; 6] = ["k", "/k", "/a/b", "/0", "/a~1b/1/~0", "/"];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, line)) = data.split_first() else { return };
    let pointer = SPECS[usize::from(selector) % SPECS.len()];
    let spec = JsonKeySpec::parse(pointer).expect("valid spec");
    let spec_pointer = if pointer.starts_with('/') { pointer.to_string() } else { format!("/{pointer}") };
    let mut scratch = Vec::new();
    let ours = extract_key(line, &spec, &mut scratch).map(<[u8]>::to_vec);
    let theirs = match serde_json::from_slice::<Value>(line) {
        Ok(value) => value,
        Err(error) => {
            let message = error.to_string();
            // serde_json stops one level earlier (127) than spate's 128, and
            // parses numbers (rejecting 1e400) where spate keeps their text.
            if message.contains("recursion limit") || message.contains("number out of range") {
                return;
            }
            assert!(
                matches!(ours, Err(JsonError::Invalid { .. } | JsonError::TooDeep { .. })),
                "spate accepted what serde_json rejects ({message}): {:?} -> {ours:?}",
                String::from_utf8_lossy(line)
            );
            return;
        }
    };
    let line_text = String::from_utf8_lossy(line);
    match (theirs.pointer(&spec_pointer), &ours) {
        (None, Err(JsonError::KeyMissing)) => {}
        (Some(Value::String(text)), Ok(key)) => assert_eq!(text.as_bytes(), &key[..], "{line_text}"),
        (Some(Value::String(text)), Err(JsonError::KeyEmpty)) => assert!(text.is_empty()),
        (Some(Value::Bool(flag)), Ok(key)) => assert_eq!(if *flag { &b"true"[..] } else { b"false" }, &key[..]),
        (Some(Value::Number(number)), Ok(key)) => {
            // spate keeps the number's text; it must parse to the same number.
            let parsed: Value = serde_json::from_slice(key).expect("key is a number's text");
            assert_eq!(parsed, Value::Number(number.clone()), "{line_text}");
        }
        (Some(Value::Null | Value::Array(_) | Value::Object(_)), Err(JsonError::KeyNotScalar { .. })) => {}
        (expected, got) => panic!("{line_text} at {spec_pointer}: serde_json {expected:?}, spate {got:?}"),
    }
});
