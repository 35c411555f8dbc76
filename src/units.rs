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

/// What [`parse_bytes`] accepts, for error messages and help texts.
pub const BYTES_SYNTAX: &str = "a byte count such as 4096, 64K, 64M, 64MiB, 1G, 1GiB, 1.5G or 2GB \
     (K, M, G and KiB, MiB, GiB are binary: 1K = 1KiB = 1024; KB, MB, GB are decimal: 1KB = 1000)";

/// Parse a byte count: a number (fractions allowed) with an optional unit
/// K, M, G, T, P or E, optionally followed by `B` or `iB`, any case. `GiB`
/// is 2^30 and `GB` is 10^9, as the library and the command line print them;
/// a bare `G` is binary too (device memory comes in powers of two, and
/// `16G` is how sizes of memory are usually written).
/// The error says what was expected.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    const BINARY: parse_size::Config = parse_size::Config::new().with_binary();
    const DECIMAL: parse_size::Config = parse_size::Config::new().with_decimal();
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let decimal = lower.ends_with('b') && !lower.ends_with("ib") && lower.len() > 1 && {
        // "64B" is bytes, not a decimal unit: a letter must precede the B.
        let before = lower.as_bytes()[lower.len() - 2];
        before.is_ascii_alphabetic()
    };
    let parser = if decimal { DECIMAL } else { BINARY };
    parser.parse_size(t).map_err(|e| match e {
        parse_size::Error::PosOverflow => format!("`{t}` is too large (more than 2^64 bytes)"),
        _ => format!("`{t}` is not {BYTES_SYNTAX}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_accepts_the_usual_spellings() {
        for (s, want) in [
            ("4096", 4096u64),
            ("64K", 64 << 10),
            ("64M", 64 << 20),
            ("64MB", 64_000_000),
            ("2gb", 2_000_000_000),
            ("1.5KB", 1500),
            ("64B", 64),
            ("64MiB", 64 << 20),
            ("64mib", 64 << 20),
            ("1G", 1 << 30),
            ("1GiB", 1 << 30),
            ("1.5G", 3 << 29),
            (" 2 GiB ", 2 << 30),
            ("0", 0),
        ] {
            assert_eq!(parse_bytes(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn parse_bytes_rejects_with_what_was_expected() {
        for s in ["", "M", "64X", "-1", "sixty", "64MBB"] {
            let e = parse_bytes(s).unwrap_err();
            assert!(e.contains("64MiB") && e.contains(s.trim()), "{s}: {e}");
        }
        let e = parse_bytes("100000E").unwrap_err();
        assert!(e.contains("too large"), "{e}");
    }
}
