//! The library's version at run time. The header carries the same numbers as
//! `VMMW_VERSION_*` macros (generated from Cargo.toml by scripts/gen-header.sh),
//! so a program can compare what it was compiled against with what it loaded.

use std::ffi::c_char;

const VERSION_NUL: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The library's version, "MAJOR.MINOR.PATCH". Static; never free it. Thread-safe.
#[no_mangle]
pub extern "C" fn vmmw_version_string() -> *const c_char {
    VERSION_NUL.as_ptr().cast()
}

/// The library's major version. Thread-safe.
#[no_mangle]
pub extern "C" fn vmmw_version_major() -> u32 {
    parse(env!("CARGO_PKG_VERSION_MAJOR"))
}

/// The library's minor version. Thread-safe.
#[no_mangle]
pub extern "C" fn vmmw_version_minor() -> u32 {
    parse(env!("CARGO_PKG_VERSION_MINOR"))
}

/// The library's patch version. Thread-safe.
#[no_mangle]
pub extern "C" fn vmmw_version_patch() -> u32 {
    parse(env!("CARGO_PKG_VERSION_PATCH"))
}

fn parse(s: &str) -> u32 {
    // Cargo guarantees numeric components; 0 is a harmless fallback.
    s.parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_and_numbers_agree() {
        // SAFETY: static NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(vmmw_version_string()) };
        let expected = format!(
            "{}.{}.{}",
            vmmw_version_major(),
            vmmw_version_minor(),
            vmmw_version_patch()
        );
        assert!(s.to_str().unwrap().starts_with(&expected), "{s:?}");
    }
}
