//! Sizes: the OS page size and byte counts written by people ("64M").
//! A leaf module every layer may use.

/// Largest size of any one reservation, block, segment or size option: 64
/// PiB, above the memory of any device or host, and small enough that
/// rounding it up to any granularity or alignment cannot overflow.
pub const MAX_BYTES: usize = 1 << 56;

/// The OS page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Parse "4096", "64K", "2M", "16G" (binary multiples).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1u64 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1u64 << 30),
        _ => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| "expected a number of bytes, optionally with K, M or G".to_owned())?;
    n.checked_mul(mul).ok_or_else(|| "too large".to_owned())
}
