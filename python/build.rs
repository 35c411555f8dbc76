//! Builds the `vmmw` command line into the wheel, so a plain
//! `pip install ./python` installs it: the `vmmw` console script and
//! `python -m vmmweights` run `vmmweights/bin/vmmw`, which pyproject.toml's
//! `include` picks up when maturin writes the wheel (after this crate is built).
//!
//! maturin builds only this crate's cdylib. The command line is the main
//! crate's `vmmw` binary (feature `cli`), so a second cargo builds it here,
//! into a target folder of its own beside the outer one (the outer build holds
//! the lock of its own folder), in the outer build's profile.
//!
//! `VMMW_CLI_BIN=<path>` copies a `vmmw` built already instead (the test
//! script builds one for its other checks).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() {
    let here = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let repo = here
        .parent()
        .expect("python/ lies inside the repository")
        .to_path_buf();
    println!("cargo:rerun-if-env-changed=VMMW_CLI_BIN");
    for input in ["src", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", repo.join(input).display());
    }
    let built = match env::var_os("VMMW_CLI_BIN") {
        Some(p) => PathBuf::from(p),
        None => build_cli(&repo),
    };
    let dest = here.join("vmmweights").join("bin").join("vmmw");
    fs::create_dir_all(dest.parent().expect("a file path has a parent"))
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dest.display()));
    fs::copy(&built, &dest).unwrap_or_else(|e| {
        panic!(
            "cannot copy the vmmw command line {} to {}: {e}",
            built.display(),
            dest.display()
        )
    });
}

/// `cargo build --features cli --bin vmmw` of the main crate; the binary's path.
fn build_cli(repo: &Path) -> PathBuf {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // The outer target folder is the ancestor cargo tagged; ours sits beside
    // its profiles, so later builds reuse what this one compiled.
    let target = out
        .ancestors()
        .find(|p| p.join("CACHEDIR.TAG").is_file())
        .unwrap_or(&out)
        .join("vmmw-cli");
    let release = env::var("PROFILE").as_deref() == Ok("release");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--features", "cli", "--bin", "vmmw", "--manifest-path"])
        .arg(repo.join("Cargo.toml"))
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
        .unwrap_or_else(|e| panic!("cannot run cargo to build the vmmw command line: {e}"));
    assert!(
        status.success(),
        "building the vmmw command line failed ({status}); its errors are above"
    );
    target
        .join(if release { "release" } else { "debug" })
        .join("vmmw")
}
