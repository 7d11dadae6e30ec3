//! HyperLogLog for `distinct-estimate`, written here rather than taken from
//! a crate because a checkpoint stores the registers byte for byte: the
//! format and the hash (xxh3, seed 0) must stay fixed across releases and
//! processes, and sketches live in a pool ([`SketchPool`]) so that opening a
//! window for a known key allocates nothing.
//!
//! `2^HLL_PRECISION` one-byte registers (1 KiB): a standard error of
//! `1.04 / sqrt(1024)`, about 3.25 %, and exact-looking small counts through
//! linear counting while registers are still empty (Flajolet et al. 2007,
//! with the small-range correction; 64-bit hashes need no large-range one).

/// Bits of the hash that pick a register.
pub const HLL_PRECISION: u32 = 10;
/// Registers per sketch, one byte each: the memory of one sketch.
pub const HLL_REGISTERS: usize = 1 << HLL_PRECISION;

/// Adds a 64-bit hash to a sketch.
#[inline]
pub(crate) fn insert(registers: &mut [u8], hash: u64) {
    debug_assert_eq!(registers.len(), HLL_REGISTERS);
    let index = (hash >> (64 - HLL_PRECISION)) as usize;
    // The rank of the remaining bits: leading zeros + 1, at most 64 - p + 1.
    let rest = (hash << HLL_PRECISION) | (1 << (HLL_PRECISION - 1));
    let rank = rest.leading_zeros() as u8 + 1;
    if registers[index] < rank {
        registers[index] = rank;
    }
}

/// The estimated number of distinct hashes inserted.
pub(crate) fn estimate(registers: &[u8]) -> f64 {
    debug_assert_eq!(registers.len(), HLL_REGISTERS);
    let register_count = HLL_REGISTERS as f64;
    let mut inverse_sum = 0.0;
    let mut zeros = 0u32;
    for &register in registers {
        inverse_sum += 1.0 / (1u64 << register) as f64;
        zeros += u32::from(register == 0);
    }
    let alpha = 0.7213 / (1.0 + 1.079 / register_count);
    let raw = alpha * register_count * register_count / inverse_sum;
    if raw <= 2.5 * register_count && zeros > 0 {
        register_count * (register_count / f64::from(zeros)).ln()
    } else {
        raw
    }
}

/// Sketches of one aggregate, back to back in one buffer, reused as windows
/// close: once the pool has grown to the most sketches held at once,
/// opening a window allocates nothing.
#[derive(Debug, Default, Clone)]
pub(crate) struct SketchPool {
    registers: Vec<u8>,
    free: Vec<u32>,
}

impl SketchPool {
    /// A zeroed sketch's index.
    pub(crate) fn allocate(&mut self) -> u32 {
        match self.free.pop() {
            Some(index) => {
                self.get_mut(index).fill(0);
                index
            }
            None => {
                let index = (self.registers.len() / HLL_REGISTERS) as u32;
                self.registers.resize(self.registers.len() + HLL_REGISTERS, 0);
                index
            }
        }
    }

    pub(crate) fn release(&mut self, index: u32) {
        debug_assert!((index as usize) < self.registers.len() / HLL_REGISTERS);
        debug_assert!(!self.free.contains(&index), "sketch {index} released twice");
        self.free.push(index);
    }

    pub(crate) fn get(&self, index: u32) -> &[u8] {
        let start = index as usize * HLL_REGISTERS;
        &self.registers[start..start + HLL_REGISTERS]
    }

    pub(crate) fn get_mut(&mut self, index: u32) -> &mut [u8] {
        let start = index as usize * HLL_REGISTERS;
        &mut self.registers[start..start + HLL_REGISTERS]
    }

    /// Sketches held (allocated and not released).
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.registers.len() / HLL_REGISTERS - self.free.len()
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.registers.capacity() + self.free.capacity() * std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_64;

    /// Estimates stay within 4 standard errors of the truth from 0 to 1M distinct values; duplicates add nothing.
    #[test]
    fn estimates_are_within_error() {
        let mut registers = vec![0u8; HLL_REGISTERS];
        assert_eq!(estimate(&registers), 0.0);
        let mut inserted = 0u64;
        for target in [1u64, 10, 100, 1000, 10_000, 100_000, 1_000_000] {
            while inserted < target {
                insert(&mut registers, xxh3_64(&inserted.to_le_bytes()));
                insert(&mut registers, xxh3_64(&inserted.to_le_bytes()));
                inserted += 1;
            }
            let relative_error = (estimate(&registers) - target as f64).abs() / target as f64;
            assert!(relative_error < 4.0 * 0.0325, "{target}: estimate {}", estimate(&registers));
            if target <= 100 {
                // Linear counting's standard deviation is sqrt(m (e^t - t - 1)) for t = n / m
                // (Whang et al. 1990): about 2.2 at n = 100, so "near exact" is one collision
                // plus 3 of those.
                let load = target as f64 / HLL_REGISTERS as f64;
                let deviation = (HLL_REGISTERS as f64 * (load.exp() - load - 1.0)).sqrt();
                let error = (estimate(&registers) - target as f64).abs();
                assert!(error <= 1.0 + 3.0 * deviation, "{target}: small counts are near exact, error {error}");
            }
        }
    }

    /// A released sketch comes back zeroed and the pool does not grow while reusing it.
    #[test]
    fn pool_reuses_zeroed_sketches() {
        let mut pool = SketchPool::default();
        let first = pool.allocate();
        insert(pool.get_mut(first), 12345);
        let second = pool.allocate();
        assert_ne!(first, second);
        pool.release(first);
        let capacity = pool.capacity_bytes();
        let again = pool.allocate();
        assert_eq!(again, first);
        assert!(pool.get(again).iter().all(|&register| register == 0));
        assert_eq!(pool.capacity_bytes(), capacity);
        assert_eq!(pool.in_use(), 2);
    }
}
