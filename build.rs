//! Gives the shared library a SONAME so programs linked against it record the
//! ABI line they need, not the file name they were linked with.
//!
//! Semver: from 1.0 on, the ABI is compatible within a major version
//! (`libvmmweights.so.1`); before 1.0 every minor version may break it, so the
//! SONAME carries the minor too (`libvmmweights.so.0.1`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        return;
    }
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    let soname = if major == "0" {
        format!("libvmmweights.so.0.{minor}")
    } else {
        format!("libvmmweights.so.{major}")
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}
