//! The library exports only the symbols this crate defines (the CUDA entry
//! points it owns and its `vmmw_preload_*` calls): the `vmmw_*` C functions
//! of the vmmweights crate it is built on stay inside, so they never
//! interpose on a libvmmweights.so the same process loads.
fn main() {
    // Symbols of the static archives linked in (every rlib, std included)
    // are not exported; this crate's own objects are not archives.
    println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    println!("cargo:rerun-if-changed=build.rs");
}
