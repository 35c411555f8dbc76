//! Builds the C library into the wheel: maturin builds this crate's `vmmw`
//! binary, and the package needs `libvmmweights.so` beside its modules
//! (`vmmweights/vmmweights/libvmmweights.so`, which pyproject.toml's
//! `include` picks up when maturin writes the wheel, after this build).
//!
//! The library is the main crate's cdylib, made by scripts/build-clib.sh (its
//! SONAME included), run here as a second cargo into a target folder of its
//! own beside the outer one (the outer build holds the lock of its own), in
//! the outer build's profile.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() {
    let here =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let repo = here
        .parent()
        .expect("python/ lies inside the repository")
        .to_path_buf();
    for input in ["src", "Cargo.toml", "Cargo.lock", "scripts/build-clib.sh"] {
        println!("cargo:rerun-if-changed={}", repo.join(input).display());
    }
    let dest = here
        .join("vmmweights")
        .join("vmmweights")
        .join("libvmmweights.so");
    // Made again when it goes missing, too.
    println!("cargo:rerun-if-changed={}", dest.display());
    let built = build_library(&repo);
    fs::create_dir_all(dest.parent().expect("a file path has a parent"))
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dest.display()));
    // A fresh file, not a copy over the old one: a process may have the old one mapped.
    let _ = fs::remove_file(&dest);
    fs::copy(&built, &dest).unwrap_or_else(|e| {
        panic!(
            "cannot copy the C library {} to {}: {e}",
            built.display(),
            dest.display()
        )
    });
}

/// scripts/build-clib.sh in the outer build's profile; the library's path.
fn build_library(repo: &Path) -> PathBuf {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // The outer target folder is the ancestor cargo tagged; ours sits beside
    // its profiles, so later builds reuse what this one compiled.
    let target = out
        .ancestors()
        .find(|p| p.join("CACHEDIR.TAG").is_file())
        .unwrap_or(&out)
        .join("vmmw-clib");
    let release = env::var("PROFILE").as_deref() == Ok("release");
    let mut cmd = Command::new("bash");
    cmd.arg(repo.join("scripts").join("build-clib.sh"))
        .arg("--target-dir")
        .arg(&target)
        // The outer build's flags are for this crate's target, not ours.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        // Cargo reads a build script's stdout as directives.
        .stdout(Stdio::null());
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run scripts/build-clib.sh to build the C library: {e}"));
    assert!(
        status.success(),
        "building the C library failed ({status}); its errors are above"
    );
    target
        .join(if release { "release" } else { "debug" })
        .join("libvmmweights.so")
}
