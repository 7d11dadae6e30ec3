//! The send-time stamp a producer writes at the start of every payload and
//! the subscriber reads back: nanoseconds since the bench's [`BenchClock`]
//! base, as [`STAMP_WIDTH`] lower-case hex digits, most significant first.
//!
//! Hex, not decimal, because encoding is then eight table lookups with no
//! division, and fixed width, because the producer patches the digits into a
//! pre-built line in place (the line never changes length). 16 digits hold
//! any `u64`, so the stamp never wraps within a run.
//!
//! After the stamp comes the [`RunTag`]: eight letters that no other run
//! shares (truncated if the payload is shorter), so a subscriber that replays
//! a server's history (`earliest`) does not mistake an earlier bench's
//! events, whose stamps count from another base, for its own.

use std::time::Instant;

/// Digits of one stamp, in bytes.
pub const STAMP_WIDTH: usize = 16;

/// Bytes of the run tag after the stamp (fewer if the payload is shorter).
pub const RUN_TAG_WIDTH: usize = 8;

/// Names one bench run inside its payloads: letters `g` to `v`, which are
/// not hex digits, so a tag is never read as part of a stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTag([u8; RUN_TAG_WIDTH]);

impl RunTag {
    /// The tag for `seed`: each letter holds four of its bits.
    pub const fn from_seed(seed: u64) -> RunTag {
        let mut tag = [0u8; RUN_TAG_WIDTH];
        let mut index = 0;
        while index < RUN_TAG_WIDTH {
            tag[index] = b'g' + ((seed >> (4 * index)) & 0xf) as u8;
            index += 1;
        }
        RunTag(tag)
    }

    /// A tag from this process's id and the wall clock.
    pub fn for_this_run() -> RunTag {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        RunTag::from_seed(nanos.rotate_left(20) ^ u64::from(std::process::id()))
    }

    pub fn bytes(&self) -> &[u8; RUN_TAG_WIDTH] {
        &self.0
    }
}

/// Two hex digits for every byte value: `HEX_PAIRS[2 * b..2 * b + 2]`.
const HEX_PAIRS: [u8; 512] = hex_pairs();

const fn hex_pairs() -> [u8; 512] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut table = [0u8; 512];
    let mut byte = 0;
    while byte < 256 {
        table[2 * byte] = DIGITS[byte >> 4];
        table[2 * byte + 1] = DIGITS[byte & 0xf];
        byte += 1;
    }
    table
}

/// The time base shared by every producer and the subscriber of one bench
/// process: stamps are only comparable within that process.
#[derive(Debug, Clone, Copy)]
pub struct BenchClock {
    base: Instant,
}

impl BenchClock {
    pub fn new() -> BenchClock {
        BenchClock { base: Instant::now() }
    }

    /// Nanoseconds since the base. A `u64` of nanoseconds lasts 584 years.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.ns_at(Instant::now())
    }

    /// Nanoseconds from the base to `instant` (0 if it is earlier).
    pub fn ns_at(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Default for BenchClock {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes `nanos` as [`STAMP_WIDTH`] hex digits.
#[inline]
pub fn encode_stamp(nanos: u64, out: &mut [u8; STAMP_WIDTH]) {
    for (index, byte) in nanos.to_be_bytes().into_iter().enumerate() {
        let pair = 2 * usize::from(byte);
        out[2 * index] = HEX_PAIRS[pair];
        out[2 * index + 1] = HEX_PAIRS[pair + 1];
    }
}

/// Reads a stamp written by [`encode_stamp`] from the first
/// [`STAMP_WIDTH`] bytes of `digits`. `None` if there are fewer bytes or any
/// is not a lower-case hex digit (the event was not written by a bench).
#[inline]
pub fn decode_stamp(digits: &[u8]) -> Option<u64> {
    let digits = digits.get(..STAMP_WIDTH)?;
    let mut nanos = 0u64;
    for &digit in digits {
        let value = match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => return None,
        };
        nanos = (nanos << 4) | u64::from(value);
    }
    Some(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every encoded stamp decodes to the same number, at the edges too.
    #[test]
    fn stamp_round_trips() {
        let mut digits = [0u8; STAMP_WIDTH];
        for nanos in [0, 1, 15, 16, 255, 1_000_000_007, u64::from(u32::MAX) + 1, u64::MAX - 1, u64::MAX] {
            encode_stamp(nanos, &mut digits);
            assert_eq!(decode_stamp(&digits), Some(nanos), "{nanos}");
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            encode_stamp(state, &mut digits);
            assert_eq!(decode_stamp(&digits), Some(state));
        }
    }

    /// The encoding is fixed-width, most significant digit first.
    #[test]
    fn stamp_is_fixed_width_hex() {
        let mut digits = [0u8; STAMP_WIDTH];
        encode_stamp(0x1234_abcd, &mut digits);
        assert_eq!(&digits, b"000000001234abcd");
        encode_stamp(u64::MAX, &mut digits);
        assert_eq!(&digits, b"ffffffffffffffff");
    }

    /// Foreign payloads are told apart: short, upper-case or non-hex input.
    #[test]
    fn stamp_rejects_foreign_payloads() {
        assert_eq!(decode_stamp(b"00000000"), None);
        assert_eq!(decode_stamp(b"000000001234ABCD"), None);
        assert_eq!(decode_stamp(b"clicked the big red button"), None);
        assert_eq!(decode_stamp(b"00000000000000ff trailing padding"), Some(255));
    }

    /// Tags are letters that are not hex digits, and differ with the seed.
    #[test]
    fn run_tags_are_not_hex() {
        let tag = RunTag::from_seed(0x0123_4567_89ab_cdef);
        assert!(tag.bytes().iter().all(|&letter| (b'g'..=b'v').contains(&letter)), "{tag:?}");
        assert_eq!(decode_stamp(&[tag.bytes().as_slice(); 2].concat()), None);
        assert_ne!(RunTag::from_seed(1), RunTag::from_seed(2));
    }

    /// The clock is monotonic from its base.
    #[test]
    fn clock_counts_up_from_base() {
        let clock = BenchClock::new();
        let first = clock.now_ns();
        let second = clock.now_ns();
        assert!(second >= first);
        assert_eq!(clock.ns_at(clock.base), 0);
    }
}
