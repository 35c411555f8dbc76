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
pub const BYTES_SYNTAX: &str =
    "a byte count such as 4096, 64K, 64M, 64MB, 64MiB, 1G, 1GiB or 1.5G (K, M, G, T are binary: 1K = 1024)";

/// Parse a byte count: a number (fractions allowed) with an optional unit
/// K, M, G, T, P or E, each optionally followed by `B` or `iB`, any case.
/// Every unit is binary (`64MB` = `64MiB` = `64M` = 64 × 2^20): device memory
/// comes in powers of two, and a decimal megabyte would rarely be meant.
/// The error says what was expected.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    const PARSER: parse_size::Config = parse_size::Config::new().with_binary();
    let t = s.trim();
    PARSER.parse_size(t).map_err(|e| match e {
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
            ("64MB", 64 << 20),
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
