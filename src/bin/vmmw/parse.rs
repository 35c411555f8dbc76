//! Value parsers for clap: a bad value is rejected while the command line is
//! read, before any device work, and clap's message names the option, the
//! value and (from here) what was expected. Exit code 2.

use vmmweights::loader::{Dtype, Strategy};

/// A byte count ("64M", "1GiB"); see [`vmmweights::units::parse_bytes`].
pub fn size(s: &str) -> Result<u64, String> {
    vmmweights::units::parse_bytes(s)
}

/// A byte count, checked and kept as written (for options parsed again later).
pub fn size_text(s: &str) -> Result<String, String> {
    size(s).map(|_| s.to_owned())
}

/// A byte count that fits in memory on this machine (`usize`).
pub fn size_usize(s: &str) -> Result<usize, String> {
    let n = size(s)?;
    usize::try_from(n).map_err(|_| format!("`{s}` is larger than this machine can address"))
}

/// A copy strategy name.
pub fn strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).map_err(|_| {
        format!("`{s}` is not a strategy; expected auto, direct, staged, read, simple, populate, hybrid or stream")
    })
}

/// A destination element type.
pub fn dtype(s: &str) -> Result<Dtype, String> {
    Dtype::parse(s).ok_or_else(|| {
        format!(
            "`{s}` is not a dtype; expected BF16, F16 or F32 (or another safetensors dtype name)"
        )
    })
}

/// A mapping preset name (checked against `Rules::preset`, lower-cased).
pub fn preset(s: &str) -> Result<String, String> {
    let l = s.trim().to_ascii_lowercase();
    match vmmweights::loader::Rules::preset(&l, None, 128) {
        Ok(_) => Ok(l),
        Err(_) => Err(format!(
            "`{s}` is not a preset; expected llama, mistral, qwen, qwen2 or qwen3"
        )),
    }
}

/// The demo's hidden size: a multiple of 128 (two kv heads of 64), 256 to 8192.
pub fn demo_hidden(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(h) if (256..=8192).contains(&h) && h % 128 == 0 => Ok(h),
        _ => Err(format!(
            "`{s}` is not a hidden size; expected a multiple of 128 from 256 to 8192"
        )),
    }
}
