//! Which JSON crate extracts an event key fastest while validating the whole
//! line without allocating? Measured over ~110-byte objects (one per line,
//! the key in a top-level field `user_id` and under the pointer `/user/id`).
//!
//! Candidates, each checked to return the same key on every line:
//!
//! * `spate_scanner`: `spate::protocol::json::extract_key` (hand-written,
//!   validating, no allocation).
//! * `serde_json_seed`: `serde_json::Deserializer::from_slice` driven by a
//!   `DeserializeSeed` that follows the pointer, skips other members with
//!   `IgnoredAny`, takes the target as a borrowed `&RawValue` (its text as
//!   written), then `end()` (whole line validated).
//! * `simd_json_tape`: copy the line into a padded buffer (simd-json parses
//!   in place), `fill_tape_padded` into a reused tape and buffers, look up.
//! * `sonic_rs_get`: `sonic_rs::get_from_slice`: lazy, fast, and it stops
//!   validating at the key (shown below: it accepts invalid lines).
//! * `sonic_rs_validate_get`: `sonic_rs::from_slice::<IgnoredAny>` (full
//!   validation) then `get_from_slice_unchecked`.
//! * `baseline_parse_line`: the line format's `parse_line` over the same
//!   lines, the ratio every row is given against.
//!
//! After criterion's own report, a summary times each candidate again
//! (fastest of 20 windows of 50 ms: ns/line, lines/s, ratio to the baseline)
//! and counts heap allocations per line with a counting global allocator.
//! Run: `nice -n 10 cargo bench --bench json_formats`. `JSON_BENCH_ONLY` (see
//! `only_one`) runs one candidate alone for `valgrind --tool=callgrind`,
//! whose instruction counts per line are repeatable on a shared machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use simd_json::prelude::*;
use spate::protocol::json::{JsonKeySpec, extract_key};

/// Counts allocations, so the summary can report allocations per line.
struct CountingAllocator;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Lines per iteration.
const LINE_COUNT: usize = 1000;

/// ~110-byte objects with varying ids and numbers.
fn corpus() -> Vec<Vec<u8>> {
    let mut state = 0x5EED_u64;
    (0..LINE_COUNT)
        .map(|index| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let user = (state >> 40) % 100_000;
            format!(
                r#"{{"ts":{},"user_id":"user{user}","user":{{"id":"u{user}","tier":"gold"}},"action":"click","amount":{}.{},"ok":true}}"#,
                1_700_000_000_000u64 + index as u64,
                state % 1000,
                (state >> 20) % 100
            )
            .into_bytes()
        })
        .collect()
}

/// One way of getting the key out of a line. Returns the key's length
/// (0 when not found), so every candidate can be checked against the others.
trait Candidate {
    fn name(&self) -> &'static str;
    fn key_size(&mut self, line: &[u8]) -> usize;
}

struct SpateScanner {
    spec: JsonKeySpec,
    scratch: Vec<u8>,
}

impl Candidate for SpateScanner {
    fn name(&self) -> &'static str {
        "spate_scanner"
    }
    fn key_size(&mut self, line: &[u8]) -> usize {
        extract_key(line, &self.spec, &mut self.scratch).map_or(0, <[u8]>::len)
    }
}

/// Follows `path` through objects (member names) and arrays (indexes).
struct PathSeed<'s, 'de> {
    path: &'s [String],
    found: &'s mut Option<&'de RawValue>,
}

impl<'de> DeserializeSeed<'de> for PathSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        if self.path.is_empty() {
            *self.found = Some(<&RawValue as serde::Deserialize>::deserialize(deserializer)?);
            Ok(())
        } else {
            deserializer.deserialize_any(self)
        }
    }
}

/// Compares a member name with the token, without allocating.
struct NameIs<'s>(&'s str);

impl<'de> DeserializeSeed<'de> for NameIs<'_> {
    type Value = bool;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameIs<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E>(self, name: &str) -> Result<bool, E> {
        Ok(name == self.0)
    }
}

impl<'de> Visitor<'de> for PathSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (token, rest) = (&self.path[0], &self.path[1..]);
        while let Some(matches) = map.next_key_seed(NameIs(token))? {
            if matches {
                map.next_value_seed(PathSeed { path: rest, found: &mut *self.found })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let index: Option<usize> = self.path[0].parse().ok();
        let mut position = 0;
        loop {
            let more = if Some(position) == index {
                seq.next_element_seed(PathSeed { path: &self.path[1..], found: &mut *self.found })?.is_some()
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                return Ok(());
            }
            position += 1;
        }
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

struct SerdeJsonSeed {
    path: Vec<String>,
}

impl Candidate for SerdeJsonSeed {
    fn name(&self) -> &'static str {
        "serde_json_seed"
    }
    fn key_size(&mut self, line: &[u8]) -> usize {
        let mut deserializer = serde_json::Deserializer::from_slice(line);
        let mut found = None;
        let seed = PathSeed { path: &self.path, found: &mut found };
        if seed.deserialize(&mut deserializer).and_then(|()| deserializer.end()).is_err() {
            return 0;
        }
        // A string's text without quotes (the corpus has no escapes).
        found.map_or(0, |raw| raw.get().trim_matches('"').len())
    }
}

struct SimdJsonTape {
    path: Vec<String>,
    input: Vec<u8>,
    buffers: simd_json::Buffers,
    tape: Option<simd_json::tape::Tape<'static>>,
}

impl Candidate for SimdJsonTape {
    fn name(&self) -> &'static str {
        "simd_json_tape"
    }
    fn key_size(&mut self, line: &[u8]) -> usize {
        self.input.clear();
        self.input.extend_from_slice(line);
        self.input.resize(line.len() + simd_json::INPUT_PADDING, 0);
        let mut tape = self.tape.take().expect("tape").reset();
        let mut size = 0;
        if simd_json::fill_tape_padded(&mut self.input, line.len(), &mut self.buffers, &mut tape).is_ok() {
            let mut value = Some(tape.as_value());
            for token in &self.path {
                value = value.and_then(|value| value.get(token.as_str()));
            }
            size = value.map_or(0, |value| value.as_str().map_or(0, str::len));
        }
        self.tape = Some(tape.reset());
        size
    }
}

struct SonicGet {
    path: Vec<String>,
}

impl Candidate for SonicGet {
    fn name(&self) -> &'static str {
        "sonic_rs_get"
    }
    fn key_size(&mut self, line: &[u8]) -> usize {
        sonic_rs::get_from_slice(line, &self.path).map_or(0, |value| value.as_raw_str().len() - 2)
    }
}

struct SonicValidateGet {
    path: Vec<String>,
}

impl Candidate for SonicValidateGet {
    fn name(&self) -> &'static str {
        "sonic_rs_validate_get"
    }
    fn key_size(&mut self, line: &[u8]) -> usize {
        if sonic_rs::from_slice::<IgnoredAny>(line).is_err() {
            return 0;
        }
        // SAFETY: the line was validated just above.
        let value = unsafe { sonic_rs::get_from_slice_unchecked(line, &self.path) };
        value.map_or(0, |value| value.as_raw_str().len() - 2)
    }
}

struct BaselineParseLine;

impl Candidate for BaselineParseLine {
    fn name(&self) -> &'static str {
        "baseline_parse_line"
    }
    fn key_size(&mut self, line: &[u8]) -> usize {
        match spate::protocol::parse_line(line, 1 << 20) {
            Ok(spate::protocol::Line::Event { key, .. }) => key.len(),
            _ => 0,
        }
    }
}

fn candidates(spec: &str) -> Vec<Box<dyn Candidate>> {
    let path: Vec<String> = match spec.strip_prefix('/') {
        Some(pointer) => pointer.split('/').map(str::to_string).collect(),
        None => vec![spec.to_string()],
    };
    vec![
        Box::new(BaselineParseLine),
        Box::new(SpateScanner { spec: JsonKeySpec::parse(spec).expect("spec"), scratch: Vec::new() }),
        Box::new(SerdeJsonSeed { path: path.clone() }),
        Box::new(SimdJsonTape {
            path: path.clone(),
            input: Vec::new(),
            buffers: simd_json::Buffers::new(256),
            tape: Some(simd_json::tape::Tape::null().reset()),
        }),
        Box::new(SonicGet { path: path.clone() }),
        Box::new(SonicValidateGet { path }),
    ]
}

fn run_all(candidate: &mut dyn Candidate, lines: &[Vec<u8>]) -> usize {
    lines.iter().map(|line| candidate.key_size(black_box(line))).sum()
}

/// Every candidate finds a key of the same total size (the baseline reads
/// the bytes before the first space, so it is skipped).
fn check_agreement(spec: &str, lines: &[Vec<u8>]) {
    let mut sizes = candidates(spec).into_iter().skip(1).map(|mut candidate| {
        let size = run_all(candidate.as_mut(), lines);
        (candidate.name(), size)
    });
    let (first_name, first_size) = sizes.next().expect("a candidate");
    assert!(first_size > 0, "{first_name} found no key");
    for (name, size) in sizes {
        assert_eq!(size, first_size, "{name} disagrees with {first_name} for {spec}");
    }
}

fn bench(criterion: &mut Criterion) {
    let lines = corpus();
    for spec in ["user_id", "/user/id"] {
        check_agreement(spec, &lines);
        let mut group = criterion.benchmark_group(format!("json {spec}"));
        group.throughput(Throughput::Elements(LINE_COUNT as u64));
        group.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(30);
        for mut candidate in candidates(spec) {
            group.bench_function(candidate.name(), |bencher| bencher.iter(|| run_all(candidate.as_mut(), &lines)));
        }
        group.finish();
    }
}

/// Times each candidate (fastest of 20 windows of 50 ms) and counts its
/// allocations per line.
fn summary() {
    let lines = corpus();
    let size: usize = lines.iter().map(Vec::len).sum();
    println!("\n## JSON key extraction, {LINE_COUNT} lines of {} bytes on average", size / LINE_COUNT);
    println!("\n| spec | candidate | validates whole line | ns/line | lines/s | x baseline | allocs/line |");
    println!("|---|---|---|---|---|---|---|");
    for spec in ["user_id", "/user/id"] {
        let mut baseline_ns = 0.0;
        for mut candidate in candidates(spec) {
            run_all(candidate.as_mut(), &lines);
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            run_all(candidate.as_mut(), &lines);
            let allocations = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / LINE_COUNT as f64;
            // The fastest of 20 windows of 50 ms: on a shared machine the
            // minimum is the least disturbed measurement.
            let mut ns_per_line = f64::MAX;
            for _ in 0..20 {
                let (started, mut passes) = (Instant::now(), 0u64);
                while started.elapsed() < Duration::from_millis(50) {
                    black_box(run_all(candidate.as_mut(), &lines));
                    passes += 1;
                }
                let window = started.elapsed().as_nanos() as f64 / (passes as f64 * LINE_COUNT as f64);
                ns_per_line = ns_per_line.min(window);
            }
            if candidate.name() == "baseline_parse_line" {
                baseline_ns = ns_per_line;
            }
            let validates = match candidate.name() {
                "sonic_rs_get" => "no",
                "baseline_parse_line" => "-",
                _ => "yes",
            };
            println!(
                "| `{spec}` | {} | {validates} | {ns_per_line:.0} | {:.2} M | {:.1} | {allocations:.1} |",
                candidate.name(),
                1e3 / ns_per_line,
                ns_per_line / baseline_ns
            );
        }
    }
    validation_notes();
}

/// Which candidates accept a line that is invalid after its key.
fn validation_notes() {
    let invalid = br#"{"user_id":"user1","user":{"id":"u1"},"x":tru}"#;
    println!("\nOn the invalid line {}:", String::from_utf8_lossy(invalid));
    for mut candidate in candidates("user_id").into_iter().skip(1) {
        let verdict = if candidate.key_size(invalid) > 0 { "ACCEPTS (does not validate)" } else { "rejects" };
        println!("- {}: {verdict}", candidate.name());
    }
}

/// `JSON_BENCH_ONLY=<candidate> JSON_BENCH_PASSES=<n>`: run one candidate
/// `n` times over the corpus for both specs and nothing else, so
/// `valgrind --tool=callgrind` can count its instructions (the difference
/// between two pass counts, divided by the extra lines, is instructions per
/// line: repeatable on a shared machine, unlike time).
fn only_one(name: &str, passes: usize) {
    let lines = corpus();
    for spec in ["user_id", "/user/id"] {
        let mut candidate = candidates(spec).into_iter().find(|candidate| candidate.name() == name).expect("candidate");
        let mut total = 0;
        for _ in 0..passes {
            total += run_all(candidate.as_mut(), &lines);
        }
        println!("{name} {spec}: {passes} passes, key bytes {total}");
    }
}

fn main() {
    if let Ok(name) = std::env::var("JSON_BENCH_ONLY") {
        let passes = std::env::var("JSON_BENCH_PASSES").ok().and_then(|text| text.parse().ok()).unwrap_or(10);
        return only_one(&name, passes);
    }
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
    // `cargo test --benches` runs this binary without `--bench`: skip the timed summary.
    if std::env::args().any(|argument| argument == "--bench") {
        summary();
    }
}
