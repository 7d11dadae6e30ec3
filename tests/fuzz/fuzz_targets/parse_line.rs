//! Fuzzes the line format: `parse_line` on the input as one line, and the
//! input fed through a small `LineBuffer` in chunks (exercising compaction,
//! growth and the too-long skip): no panic, and every event respects the
//! format (non-empty key of at most 255 bytes, with no space).
#![no_main]

use libfuzzer_sys::fuzz_target;
use spate::protocol::{KEY_SIZE_MAX, Line, LineBuffer, Next, parse_line};

/// Longest accepted line in the buffer test: small, so the fuzzer reaches it.
const LINE_SIZE_MAX: usize = 40;

fn check(line: &[u8], line_size_max: usize) {
    if let Ok(Line::Event { key, payload }) = parse_line(line, line_size_max) {
        assert!(!key.is_empty() && key.len() <= KEY_SIZE_MAX && !key.contains(&b' '));
        assert!(key.len() + payload.len() <= line.len());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, 1 << 20);
    let mut buffer = LineBuffer::new(8, 32, LINE_SIZE_MAX);
    let mut last_line_number = 0;
    let mut pending = data;
    loop {
        match buffer.next_line() {
            Next::Line { line, line_number } => {
                assert!(line_number > last_line_number && line.len() <= LINE_SIZE_MAX + 1);
                last_line_number = line_number;
                check(line, LINE_SIZE_MAX);
            }
            Next::TooLong { line_number, .. } => {
                assert!(line_number > last_line_number);
                last_line_number = line_number;
            }
            Next::NeedMore => {
                if pending.is_empty() {
                    break;
                }
                // Reads of at most 13 bytes: lines straddle reads.
                let spare = buffer.spare();
                assert!(!spare.is_empty());
                let count = pending.len().min(spare.len()).min(13);
                spare[..count].copy_from_slice(&pending[..count]);
                buffer.filled(count);
                pending = &pending[count..];
            }
        }
    }
});
