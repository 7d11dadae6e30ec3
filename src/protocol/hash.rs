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

/// How a stream maps keys to its partitions (the stream setting
/// `"partitioner"`, kept in the catalog; streams from before the setting
/// existed are `xxh3`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Partitioner {
    /// [`partition_of`]: XXH3-64 of the key, modulo the partition count.
    #[default]
    Xxh3,
    /// [`murmur2_partition_of`]: the Java Kafka client's (and
    /// kafka-python's) default for keyed records, so a key sent as a line
    /// lands in the partition a Kafka producer would pick for it.
    Murmur2,
}

impl Partitioner {
    /// The partition of `key` in `0..partition_count`.
    #[inline]
    pub fn partition_of(self, key: &[u8], partition_count: u32) -> u32 {
        match self {
            Partitioner::Xxh3 => partition_of(key, partition_count),
            Partitioner::Murmur2 => murmur2_partition_of(key, partition_count),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Partitioner::Xxh3 => "xxh3",
            Partitioner::Murmur2 => "murmur2",
        }
    }
}

/// MurmurHash2 (32-bit) exactly as Kafka's Java client computes it
/// (`org.apache.kafka.common.utils.Utils.murmur2`: seed `0x9747b28c`,
/// little-endian 4-byte blocks, the tail folded in from its highest byte),
/// returned as the Java `int`'s bits.
pub fn murmur2(key: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut hash = SEED ^ key.len() as u32;
    let mut blocks = key.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        hash = hash.wrapping_mul(M) ^ k;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        for (index, &byte) in tail.iter().enumerate().rev() {
            hash ^= u32::from(byte) << (8 * index);
        }
        hash = hash.wrapping_mul(M);
    }
    hash ^= hash >> 13;
    hash = hash.wrapping_mul(M);
    hash ^ (hash >> 15)
}

/// The partition the Java Kafka client's default partitioner picks for a
/// keyed record: `toPositive(murmur2(key)) % partitions`, where
/// `toPositive` clears the sign bit (it is not `abs`).
#[inline]
pub fn murmur2_partition_of(key: &[u8], partition_count: u32) -> u32 {
    debug_assert!(partition_count > 0);
    (murmur2(key) & 0x7fff_ffff) % partition_count
}

#[cfg(test)]
mod tests {
    use super::*;

    /// murmur2 gives the values Kafka's own test suite pins
    /// (`UtilsTest.testMurmur2`, Java `int`s), and the partitions
    /// kafka-python's `DefaultPartitioner` picks for 256 partitions
    /// (`(murmur2(key) & 0x7fffffff) % 256`), sign bit cleared, not abs.
    #[test]
    fn murmur2_matches_kafkas_test_vectors() {
        let vectors: [(&[u8], i32, u32); 8] = [
            (b"21", -973932308, 236),
            (b"foobar", -790332482, 190),
            (b"a-little-bit-long-string", -985981536, 160),
            (b"a-little-bit-longer-string", -1486304829, 195),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, 205),
            (b"abc", 479470107, 27),
            (b"", 275646681, 217),
            (b"user42", -154169308, 36),
        ];
        for (key, java_int, partition) in vectors {
            let name = String::from_utf8_lossy(key);
            assert_eq!(murmur2(key) as i32, java_int, "murmur2 of {name:?}");
            assert_eq!(murmur2_partition_of(key, 256), partition, "partition of {name:?}");
            assert_eq!(Partitioner::Murmur2.partition_of(key, 256), partition);
            assert_eq!(Partitioner::Xxh3.partition_of(key, 256), partition_of(key, 256));
        }
    }

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
