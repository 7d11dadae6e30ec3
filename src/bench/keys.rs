//! Keys and how often each is drawn.
//!
//! Sampling is kept off the producer's hot path, and so is any lookup by key
//! index. Before the run, every connection draws a ring of draws from the
//! chosen [`KeyDistribution`] and then cycles through it, so a Zipf draw
//! (rejection sampling, tens of nanoseconds) costs one sequential read per
//! event. A ring of a million draws repeats the sequence, not the shape: every
//! rank keeps its share.
//!
//! A draw is not a key index but the first 8 bytes of the line itself (a
//! "line head": the key, its space, padding), so the producer writes a key
//! with one 8-byte store. Looking keys up in a table by random index instead
//! cost a cache miss per event once the server's log traffic had evicted the
//! table (measured: a third of the producer's user time). Hot-set draws
//! (hotspot) are tagged ranks, resolved through a small table of the current
//! hot set's heads, because the hot set moves during the run and the ring does
//! not.
//!
//! Keys are `k` followed by the zero-padded index (`k00000` to `k99999` for
//! 100 000 keys), all of one width, so every line of a run has the same length.
//! Key index 0 is the hottest under Zipf. Indices map to partitions through
//! the server's hash, so neighbouring indices land on unrelated partitions.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// Most draws in one connection's ring (8 MiB of `u64`).
pub const DRAW_RING_LEN_MAX: usize = 1 << 20;
/// Fewest draws in a ring, however many connections share the budget.
pub const DRAW_RING_LEN_MIN: usize = 1 << 14;
/// Bytes all rings of a run may take together.
pub const DRAW_RING_BYTES_TOTAL_MAX: usize = 256 << 20;
/// Most distinct keys: `k` and 7 digits, so a key fits one 8-byte line head.
pub const KEY_COUNT_MAX: u32 = 10_000_000;
/// Widest key, in bytes.
pub const KEY_WIDTH_MAX: usize = 8;
/// The first byte of every key; a draw whose low byte is [`HOT_TAG`] instead
/// is a hot-set rank (`rank << 8`).
const KEY_PREFIX: u8 = b'k';
const HOT_TAG: u8 = 0;
/// Byte after the key's space in a line head (the payload's padding; a stamp
/// overwrites it).
pub const HEAD_PADDING: u8 = b'.';

const _: () = assert!(DRAW_RING_LEN_MAX.is_power_of_two() && DRAW_RING_LEN_MIN.is_power_of_two());
const _: () = assert!((KEY_COUNT_MAX - 1).ilog10() as usize + 2 == KEY_WIDTH_MAX, "largest key fills a head");
const _: () = assert!(KEY_PREFIX != HOT_TAG, "keys and hot ranks are told apart by the low byte");

/// Draws in each connection's ring: a power of two, within the total budget.
pub fn draw_ring_len(connection_count: usize) -> usize {
    let budget = DRAW_RING_BYTES_TOTAL_MAX / 8 / connection_count.max(1);
    let len = if budget.is_power_of_two() { budget } else { budget.next_power_of_two() / 2 };
    len.clamp(DRAW_RING_LEN_MIN, DRAW_RING_LEN_MAX)
}

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeyDistribution {
    /// Every key equally often.
    Uniform,
    /// Key index `i` drawn in proportion to `1 / (i + 1)^exponent`.
    Zipf { exponent: f64 },
    /// `hot_share` of draws go to a set of `hot_key_count` keys that moves to
    /// the next `hot_key_count` keys every shift; the rest are uniform.
    Hotspot { hot_key_count: u32, hot_share: f64, shift_every_ns: u64 },
}

/// Why a distribution cannot be built.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyError {
    KeyCount { key_count: u32, key_count_max: u32 },
    ZipfExponent { exponent: f64 },
    HotKeyCount { hot_key_count: u32, key_count: u32 },
    HotShare { hot_share: f64 },
    ShiftEvery { shift_every_ns: u64 },
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::KeyCount { key_count, key_count_max } => {
                write!(f, "--keys {key_count}: must be between 1 and {key_count_max}")
            }
            KeyError::ZipfExponent { exponent } => write!(f, "--zipf-s {exponent}: must be a finite number > 0"),
            KeyError::HotKeyCount { hot_key_count, key_count } => {
                write!(f, "--hot-keys {hot_key_count}: must be between 1 and --keys ({key_count})")
            }
            KeyError::HotShare { hot_share } => write!(f, "--hot-share {hot_share}: must be between 0 and 1"),
            KeyError::ShiftEvery { shift_every_ns } => {
                write!(f, "--shift-every-s: must be at least 1 ms, got {shift_every_ns} ns")
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// A checked distribution over `key_count` keys of one width.
#[derive(Debug, Clone)]
pub struct KeySampler {
    distribution: KeyDistribution,
    key_count: u32,
    key_width: usize,
    zipf: Option<Zipf<f64>>,
}

impl KeySampler {
    pub fn new(distribution: KeyDistribution, key_count: u32) -> Result<KeySampler, KeyError> {
        if key_count == 0 || key_count > KEY_COUNT_MAX {
            return Err(KeyError::KeyCount { key_count, key_count_max: KEY_COUNT_MAX });
        }
        let mut zipf = None;
        match distribution {
            KeyDistribution::Uniform => {}
            KeyDistribution::Zipf { exponent } => {
                if !(exponent.is_finite() && exponent > 0.0) {
                    return Err(KeyError::ZipfExponent { exponent });
                }
                zipf =
                    Some(Zipf::new(f64::from(key_count), exponent).map_err(|_| KeyError::ZipfExponent { exponent })?);
            }
            KeyDistribution::Hotspot { hot_key_count, hot_share, shift_every_ns } => {
                if hot_key_count == 0 || hot_key_count > key_count {
                    return Err(KeyError::HotKeyCount { hot_key_count, key_count });
                }
                if !(0.0..=1.0).contains(&hot_share) {
                    return Err(KeyError::HotShare { hot_share });
                }
                if shift_every_ns < 1_000_000 {
                    return Err(KeyError::ShiftEvery { shift_every_ns });
                }
            }
        }
        let key_width = 1 + (key_count - 1).checked_ilog10().map_or(1, |log| log as usize + 1);
        assert!(key_width <= KEY_WIDTH_MAX);
        Ok(KeySampler { distribution, key_count, key_width, zipf })
    }

    pub fn key_width(&self) -> usize {
        self.key_width
    }

    /// The bytes of key `index`.
    #[cfg(test)]
    pub fn key(&self, index: u32) -> Vec<u8> {
        self.line_head(index).to_le_bytes()[..self.key_width].to_vec()
    }

    /// The first 8 bytes of a line with key `index`, little-endian: the key,
    /// then (if it is shorter than 8 bytes) a space and padding.
    pub fn line_head(&self, index: u32) -> u64 {
        assert!(index < self.key_count);
        let mut head = [HEAD_PADDING; KEY_WIDTH_MAX];
        head[0] = KEY_PREFIX;
        let mut rest = index;
        for slot in head[1..self.key_width].iter_mut().rev() {
            *slot = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        debug_assert_eq!(rest, 0);
        if self.key_width < KEY_WIDTH_MAX {
            head[self.key_width] = b' ';
        }
        u64::from_le_bytes(head)
    }

    /// `draw_count` draws from a generator seeded with `seed`: line heads, or
    /// (hotspot) hot-set ranks for [`resolve_head`].
    pub fn draws(&self, draw_count: usize, seed: u64) -> Vec<u64> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut draws = Vec::with_capacity(draw_count);
        for _ in 0..draw_count {
            let draw = match (self.distribution, &self.zipf) {
                (KeyDistribution::Zipf { .. }, Some(zipf)) => {
                    // Samples are ranks 1..=key_count as floats.
                    let rank = zipf.sample(&mut rng) as u32;
                    self.line_head(rank.clamp(1, self.key_count) - 1)
                }
                (KeyDistribution::Hotspot { hot_key_count, hot_share, .. }, _) if rng.random_bool(hot_share) => {
                    u64::from(rng.random_range(0..hot_key_count)) << 8 | u64::from(HOT_TAG)
                }
                _ => self.line_head(rng.random_range(0..self.key_count)),
            };
            draws.push(draw);
        }
        draws
    }

    /// Where the hot set starts `elapsed_ns` into the run (0 unless hotspot).
    pub fn hot_base(&self, elapsed_ns: u64) -> u32 {
        match self.distribution {
            KeyDistribution::Hotspot { hot_key_count, shift_every_ns, .. } => {
                let shift_count = elapsed_ns / shift_every_ns;
                let base = u128::from(shift_count) * u128::from(hot_key_count) % u128::from(self.key_count);
                base as u32
            }
            _ => 0,
        }
    }

    /// Fills `heads` with the line heads of the hot set starting at
    /// `hot_base` (empty unless hotspot). Reuses `heads`' memory.
    pub fn hot_heads(&self, hot_base: u32, heads: &mut Vec<u64>) {
        heads.clear();
        if let KeyDistribution::Hotspot { hot_key_count, .. } = self.distribution {
            let key_count = u64::from(self.key_count);
            let index = |rank: u32| ((u64::from(hot_base) + u64::from(rank)) % key_count) as u32;
            heads.extend((0..hot_key_count).map(|rank| self.line_head(index(rank))));
        }
    }

    #[cfg(test)]
    pub fn key_count(&self) -> u32 {
        self.key_count
    }
}

/// The line head of `draw`, given the current hot set's heads.
#[inline]
pub fn resolve_head(draw: u64, hot_heads: &[u64]) -> u64 {
    if draw as u8 == HOT_TAG { hot_heads[(draw >> 8) as usize] } else { draw }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(sampler: &KeySampler, head: u64) -> u32 {
        let key = &head.to_le_bytes()[..sampler.key_width()];
        assert_eq!(key[0], KEY_PREFIX);
        std::str::from_utf8(&key[1..]).unwrap().parse().unwrap()
    }

    fn counts(sampler: &KeySampler, draw_count: usize, hot_base: u32) -> Vec<u64> {
        let mut heads = Vec::new();
        sampler.hot_heads(hot_base, &mut heads);
        let mut counts = vec![0u64; sampler.key_count() as usize];
        for draw in sampler.draws(draw_count, 7) {
            counts[index_of(sampler, resolve_head(draw, &heads)) as usize] += 1;
        }
        counts
    }

    /// Keys are distinct, of one width, zero-padded, and a line head is the
    /// key, a space and padding.
    #[test]
    fn keys_are_fixed_width() {
        let sampler = KeySampler::new(KeyDistribution::Uniform, 100_000).unwrap();
        assert_eq!(sampler.key_width(), 6);
        assert_eq!(sampler.key(0), b"k00000");
        assert_eq!(sampler.key(42), b"k00042");
        assert_eq!(sampler.key(99_999), b"k99999");
        assert_eq!(&sampler.line_head(42).to_le_bytes(), b"k00042 .");
        let key = |key_count, index| KeySampler::new(KeyDistribution::Uniform, key_count).unwrap().key(index);
        assert_eq!(key(1, 0), b"k0");
        assert_eq!(key(10, 9), b"k9");
        assert_eq!(key(11, 10), b"k10");
        let widest = KeySampler::new(KeyDistribution::Uniform, KEY_COUNT_MAX).unwrap();
        assert_eq!(&widest.line_head(KEY_COUNT_MAX - 1).to_le_bytes(), b"k9999999");
        let sampler = KeySampler::new(KeyDistribution::Uniform, 1000).unwrap();
        let distinct: std::collections::HashSet<Vec<u8>> = (0..1000).map(|index| sampler.key(index)).collect();
        assert_eq!(distinct.len(), 1000);
        assert!(KeySampler::new(KeyDistribution::Uniform, 0).is_err());
        assert!(KeySampler::new(KeyDistribution::Uniform, KEY_COUNT_MAX + 1).is_err());
    }

    /// Rings stay within their memory budget and are powers of two.
    #[test]
    fn ring_lengths_are_bounded() {
        assert_eq!(draw_ring_len(1), DRAW_RING_LEN_MAX);
        assert_eq!(draw_ring_len(32), DRAW_RING_LEN_MAX);
        assert_eq!(draw_ring_len(33), DRAW_RING_LEN_MAX / 2);
        assert_eq!(draw_ring_len(1024), 1 << 15);
        for connection_count in 1..2000 {
            let len = draw_ring_len(connection_count);
            assert!(len.is_power_of_two());
            assert!(len == DRAW_RING_LEN_MIN || len * 8 * connection_count <= DRAW_RING_BYTES_TOTAL_MAX);
        }
    }

    /// Uniform draws hit every key about equally often.
    #[test]
    fn uniform_is_flat() {
        let sampler = KeySampler::new(KeyDistribution::Uniform, 100).unwrap();
        let counts = counts(&sampler, 1_000_000, 0);
        // Mean 10 000 per key, standard deviation about 100: 5 % is 5 sigma.
        assert!(counts.iter().all(|&count| (9_500..=10_500).contains(&count)), "{counts:?}");
    }

    /// Zipf draws follow 1/rank^s: the top keys' shares match the formula and
    /// shares fall with rank.
    #[test]
    fn zipf_follows_the_power_law() {
        let exponent = 1.1;
        let key_count = 1000;
        let sampler = KeySampler::new(KeyDistribution::Zipf { exponent }, key_count).unwrap();
        let draw_count = 1_000_000;
        let counts = counts(&sampler, draw_count, 0);
        let harmonic: f64 = (1..=key_count).map(|rank| 1.0 / f64::from(rank).powf(exponent)).sum();
        for rank in [1u32, 2, 10] {
            let expected = draw_count as f64 / f64::from(rank).powf(exponent) / harmonic;
            let observed = counts[rank as usize - 1] as f64;
            assert!((observed / expected - 1.0).abs() < 0.05, "rank {rank}: {observed} vs {expected}");
        }
        assert!(counts[0] > counts[9] && counts[9] > counts[99] && counts[99] > counts[999]);
    }

    /// Hotspot sends the hot share to the hot set and moves the set each shift.
    #[test]
    fn hotspot_moves_its_hot_set() {
        let shift_every_ns = 1_000_000_000;
        let distribution = KeyDistribution::Hotspot { hot_key_count: 10, hot_share: 0.8, shift_every_ns };
        let sampler = KeySampler::new(distribution, 1000).unwrap();
        assert_eq!(sampler.hot_base(0), 0);
        assert_eq!(sampler.hot_base(shift_every_ns - 1), 0);
        assert_eq!(sampler.hot_base(shift_every_ns), 10);
        assert_eq!(sampler.hot_base(100 * shift_every_ns), 0, "the hot set wraps around the key space");
        for base in [0, 10, 995] {
            let counts = counts(&sampler, 200_000, base);
            let hot: u64 = (0..10).map(|rank| counts[((base + rank) % 1000) as usize]).sum();
            // 80 % hot plus the cold draws that land in the hot set (0.2 * 1 %).
            let share = hot as f64 / 200_000.0;
            assert!((share - 0.802).abs() < 0.01, "base {base}: hot share {share}");
        }
        let mut heads = vec![1, 2, 3];
        KeySampler::new(KeyDistribution::Uniform, 10).unwrap().hot_heads(0, &mut heads);
        assert!(heads.is_empty(), "no hot set outside hotspot");
    }

    /// Bad parameters are refused with the numbers that are wrong.
    #[test]
    fn bad_distributions_are_refused() {
        assert!(KeySampler::new(KeyDistribution::Zipf { exponent: 0.0 }, 10).is_err());
        assert!(KeySampler::new(KeyDistribution::Zipf { exponent: f64::NAN }, 10).is_err());
        let hotspot = |hot_key_count, hot_share, shift_every_ns| KeyDistribution::Hotspot {
            hot_key_count,
            hot_share,
            shift_every_ns,
        };
        assert_eq!(
            KeySampler::new(hotspot(11, 0.5, 1_000_000_000), 10).unwrap_err(),
            KeyError::HotKeyCount { hot_key_count: 11, key_count: 10 }
        );
        assert!(KeySampler::new(hotspot(1, 1.5, 1_000_000_000), 10).is_err());
        assert!(KeySampler::new(hotspot(1, 0.5, 10), 10).is_err());
    }
}
