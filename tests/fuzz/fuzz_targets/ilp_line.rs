//! Fuzzes `spate::protocol::ilp::parse_ilp_line`: never panics, and on an
//! accepted point: the series key is a fixed point (a line made of the key
//! parses to the same key), and the stored-payload accessors agree with the
//! parsed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate::protocol::ilp::{self, IlpLine, IlpScratch, parse_ilp_line};

fuzz_target!(|line: &[u8]| {
    let mut scratch = IlpScratch::default();
    let Ok(IlpLine::Point(point)) = parse_ilp_line(line, &mut scratch) else { return };
    let series_key = point.series_key().to_vec();
    let payload = point.payload();
    let parsed: Vec<_> = point.fields().collect();
    assert!(!parsed.is_empty(), "a point has at least one field");
    assert_eq!(parsed, ilp::fields(payload).collect::<Vec<_>>());
    assert_eq!(point.timestamp_ns(), ilp::timestamp_ns(payload));
    for (key, _) in &parsed {
        let mut name = Vec::new();
        key.unescape_into(&mut name);
        assert!(key.unescaped_eq(&name));
        assert!(point.field(&name).is_some());
    }
    let mut again = series_key.clone();
    again.extend_from_slice(b" f=1i");
    let mut scratch = IlpScratch::default();
    let reparsed = ilp::parse_point(&again, &mut scratch).expect("a series key plus a field parses");
    assert_eq!(reparsed.series_key(), &series_key[..], "the series key is canonical");
});
