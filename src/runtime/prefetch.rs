//! Software prefetch: a hint that the memory at an address will be read
//! soon, so the cache line is fetched while other work runs. A hint only:
//! it never faults (any address may be given) and changes no result; on
//! targets without one it does nothing.

/// Starts fetching the cache line holding `address` into every cache level.
#[inline(always)]
pub fn prefetch<T>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults, so
    // any address (dangling, null, unmapped) is fine.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// [`prefetch`] of the `lines` cache lines from `address` on.
#[inline(always)]
pub fn prefetch_lines<T>(address: *const T, lines: usize) {
    for line in 0..lines {
        prefetch(address.cast::<u8>().wrapping_add(line * 64));
    }
}
