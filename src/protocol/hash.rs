//! The stable key hash that maps a key to a partition.
//!
//! `partition = xxh3_64(key, seed = 0) % partitions`. XXH3 is a published,
//! versioned algorithm (xxHash 0.8 spec) with the same output on every
//! machine, endianness and release, which matters because partition logs (and
//! later, files on disk) depend on it. ahash is deliberately *not* used here:
//! its per-process seed is a feature for in-memory maps and a bug for
//! placement.

use xxhash_rust::xxh3::xxh3_64;

/// The stable 64-bit hash of a key (XXH3-64, seed 0).
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// The partition a key belongs to, in `0..partition_count`.
#[inline]
pub fn partition_of(key: &[u8], partition_count: u32) -> u32 {
    debug_assert!(partition_count > 0);
    (key_hash(key) % u64::from(partition_count)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the hash to published XXH3-64 values and to fixed partitions, so a
    /// dependency bump or a refactor that changes placement fails loudly.
    #[test]
    fn hash_test_vectors_are_stable() {
        // Published reference value for the empty input (xxHash test suite).
        assert_eq!(key_hash(b""), 0x2D06_8005_38D3_94C2);
        let vectors: [(&[u8], u64, u32); 4] = [
            (b"user42", 0x9fdc_8e44_c5b9_267c, 124),
            (b"a", 0xe6c6_32b6_1e96_4e1f, 31),
            (b"sensor-0001", 0xb808_adb6_0aa9_b8e6, 230),
            (b"payments:eu:7", 0x2e53_c2d3_7f77_670e, 14),
        ];
        for (key, hash, partition) in vectors {
            let name = String::from_utf8_lossy(key);
            assert_eq!(key_hash(key), hash, "hash of {name}: {:#x}", key_hash(key));
            assert_eq!(partition_of(key, 256), partition, "partition of {name}");
        }
    }

    /// Keys spread over partitions roughly evenly (no partition gets more than
    /// twice its share of 100k sequential keys).
    #[test]
    fn sequential_keys_spread_evenly() {
        let mut counts = [0u32; 256];
        for index in 0..100_000u32 {
            let key = format!("key-{index}");
            counts[partition_of(key.as_bytes(), 256) as usize] += 1;
        }
        let share = 100_000 / 256;
        assert!(counts.iter().all(|&count| count < share * 2 && count > share / 2));
    }
}
