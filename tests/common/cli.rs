//! Running the built `vmmw` binary on the host backend, and the small
//! checkpoints the CLI tests use.

use std::path::Path;
use std::process::Command;

pub use super::loader::{generate, write_file, SMALL};
pub use vmmweights::loader::Dtype;

/// What one run of `vmmw` gave.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Both streams, for assertion messages.
    pub fn all(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }

    /// stdout parsed as one JSON document (the test fails otherwise).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document: {e}\n{}", self.all()))
    }
}

/// Run `vmmw args` with VMMW_BACKEND=host plus `env`.
pub fn vmmw_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vmmw"));
    c.args(args).env("VMMW_BACKEND", "host");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("the vmmw binary runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Run `vmmw args` with VMMW_BACKEND=host.
pub fn vmmw(args: &[&str]) -> Run {
    vmmw_env(args, &[])
}

/// A one-file bf16 checkpoint of the SMALL Llama-like shape in `dir`.
pub fn small_checkpoint(dir: &Path) -> String {
    let t = generate(&SMALL, Dtype::Bf16);
    let p = dir.join("model.safetensors");
    write_file(&p, &t, Dtype::Bf16);
    p.to_str().unwrap().to_owned()
}

/// Parse `path` as XML and check it is an SVG document; returns its text nodes.
pub fn svg_texts(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("chart {} not written: {e}", path.display()));
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("chart {} is not valid XML: {e}", path.display()));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg", "{}", path.display());
    assert!(root.attribute("width").is_some() && root.attribute("height").is_some());
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_owned())
        .collect()
}
