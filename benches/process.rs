//! The processor's per-event cost, in ns/event, and the key lookup behind it.
//!
//! * `on_event`: a partition processor with two aggregates (a count and a
//!   sum of a JSON field, both in 1 s tumbling windows on arrival time) over
//!   10 000 keys, payloads `{"amount":N}`; arrival time advances 1 ms per
//!   100 events, so windows close (and sweep) as they would on a shard.
//! * `lookup_hashbrown_entry_ref` against `lookup_std_double_probe`: finding a
//!   key's state by borrowed `&[u8]` and inserting it when new. hashbrown's
//!   `entry_ref` hashes and probes once and allocates only for a new key;
//!   std's `HashMap` (same ahash hasher) can look up by `&[u8]` too, but
//!   returning the found value from a conditional borrow needs a second
//!   probe (`contains_key`, then `get_mut` or `insert`) on every hit, the
//!   case that matters. This is the number that decides between them.
//!
//! Each line is the fastest of 15 runs. Run: `nice cargo bench --bench process`.

use std::collections::HashMap as StdHashMap;
mod common;

use std::hint::black_box;

use common::fastest_ns_per_event;
use spate::aggregate::{AggregateDeclaration, PartitionProcessor, ProcessorLimits};

const KEY_COUNT: usize = 10_000;
const EVENT_COUNT: usize = 1_000_000;

fn keys() -> Vec<Vec<u8>> {
    (0..KEY_COUNT).map(|index| format!("user{index:06}").into_bytes()).collect()
}

/// A scrambled but repeatable key order.
fn key_index(event: usize) -> usize {
    (event.wrapping_mul(2_654_435_761) >> 7) % KEY_COUNT
}

fn bench_on_event(keys: &[Vec<u8>], declaration_count: usize) -> f64 {
    let payloads: Vec<Vec<u8>> = (0..64).map(|value| format!("{{\"amount\":{value}}}").into_bytes()).collect();
    let declarations = [
        r#"{"name":"n","stream":"s","kind":"count","window":{"type":"tumbling","size_ms":1000},"output":"o"}"#,
        r#"{"name":"total","stream":"s","kind":"sum","value":"json:/amount","window":{"type":"tumbling","size_ms":1000},"output":"o"}"#,
    ];
    let mut offset = 0u64;
    let mut closed = 0u64;
    let mut processor = PartitionProcessor::new("s", 0, 0, ProcessorLimits::default());
    for declaration in declarations.into_iter().take(declaration_count) {
        let declaration = AggregateDeclaration::from_json(declaration.as_bytes()).expect("valid");
        processor.add_aggregate(declaration, 0).expect("added");
    }
    fastest_ns_per_event(|| {
        for event in 0..EVENT_COUNT {
            let key = &keys[key_index(event) % keys.len()];
            let arrival_ms = 1_000_000 + offset / 100;
            processor.on_event(offset, key, &payloads[event % payloads.len()], arrival_ms, &mut |window| {
                closed += black_box(window.count)
            });
            offset += 1;
        }
        EVENT_COUNT
    })
}

fn bench_hashbrown(keys: &[Vec<u8>]) -> f64 {
    let mut map: hashbrown::HashMap<Box<[u8]>, u64, ahash::RandomState> = hashbrown::HashMap::default();
    fastest_ns_per_event(|| {
        for event in 0..EVENT_COUNT {
            let key = keys[key_index(event)].as_slice();
            *map.entry_ref(key).or_insert(0) += 1;
        }
        EVENT_COUNT
    })
}

fn bench_std(keys: &[Vec<u8>]) -> f64 {
    let mut map: StdHashMap<Box<[u8]>, u64, ahash::RandomState> = StdHashMap::default();
    fastest_ns_per_event(|| {
        for event in 0..EVENT_COUNT {
            let key = keys[key_index(event)].as_slice();
            let value = if map.contains_key(key) {
                map.get_mut(key).expect("present")
            } else {
                map.entry(key.into()).or_insert(0)
            };
            *value += 1;
        }
        EVENT_COUNT
    })
}

/// Reading `json:/ms` from the payload `scripts/bench-aggregates` sends (the
/// fourth member of a ~100-byte object), as a sum aggregate does per event:
/// scanning for it (`hinted` false), or at the place the JSON listener
/// found while validating the line (`RecordRef::value_at`).
fn bench_extract_value(hinted: bool) -> f64 {
    let spec = spate::protocol::json::JsonKeySpec::parse("/ms").expect("valid pointer");
    let payloads: Vec<Vec<u8>> = (0..64)
        .map(|i| {
            format!(
                r#"{{"user_id":"user{}","action":"click","page":"/products/{}","ms":{},"ok":true,"ref":"r{i:012}"}}"#,
                i * 7919 % 10_000,
                i % 977,
                i * 13 % 1000
            )
            .into_bytes()
        })
        .collect();
    let key = spate::protocol::json::JsonKeySpec::parse("/user_id").expect("valid pointer");
    let hints: Vec<u16> = payloads
        .iter()
        .map(|payload| {
            let mut key_scratch = Vec::new();
            let parsed = spate::protocol::json::parse_json_line_with(payload, &key, b"ms", &mut key_scratch);
            let hint = parsed.expect("a valid event").1;
            assert!(hint != 0, "the listener hints json:/ms");
            if hinted { hint } else { 0 }
        })
        .collect();
    let mut scratch = Vec::new();
    let mut total = 0usize;
    let ns = fastest_ns_per_event(|| {
        for event in 0..EVENT_COUNT {
            let (payload, hint) = (&payloads[event % payloads.len()], hints[event % payloads.len()]);
            let value = spate::protocol::json::extract_value_at(payload, &spec, hint, &mut scratch);
            total += value.map_or(0, <[u8]>::len);
        }
        EVENT_COUNT
    });
    black_box(total);
    ns
}

fn main() {
    let extract = bench_extract_value(false);
    println!("extract_value json:/ms from a ~100-byte event: {extract:.1} ns/event");
    let hinted = bench_extract_value(true);
    println!("the same at the JSON listener's hint (extract_value_at): {hinted:.1} ns/event");
    let keys = keys();
    let on_event = bench_on_event(&keys, 2);
    let count_only = bench_on_event(&keys, 1);
    let few_keys = bench_on_event(&keys[..100], 2);
    let hashbrown = bench_hashbrown(&keys);
    let std = bench_std(&keys);
    println!("on_event (count + sum, 1 s tumbling, {KEY_COUNT} keys): {on_event:.1} ns/event");
    println!("on_event (count only, 1 s tumbling, {KEY_COUNT} keys): {count_only:.1} ns/event");
    println!("on_event (count + sum, 1 s tumbling, 100 keys): {few_keys:.1} ns/event");
    println!("lookup_hashbrown_entry_ref: {hashbrown:.1} ns/event");
    println!("lookup_std_double_probe:    {std:.1} ns/event ({:.2}x hashbrown)", std / hashbrown);
}
