//! What a file or folder that is not a checkpoint is instead, and what to
//! pass: a `.safetensors` file that is a ZIP (`torch.save`), a pickle, a
//! GGUF file, a Git LFS pointer, an HTML page or other text is named by its
//! first bytes rather than reported as a header length past the end; a
//! folder without safetensors names the files it holds that can be loaded
//! or converted.
//!
//! Consulted only once a file has failed the safetensors header checks (or
//! a folder holds no checkpoint), so a valid checkpoint never pays for it.

use std::os::unix::fs::FileExt;
use std::path::Path;

use super::shard::open_regular;

/// How much of a file is read to tell what it is.
const SNIFF: usize = 512;

/// What the file at `path` is, when its first bytes say it is a known format
/// other than safetensors, with what to pass instead; None when they say
/// nothing (random bytes, a damaged safetensors file).
pub(super) fn describe_file(path: &Path) -> Option<String> {
    let (file, _) = open_regular(path).ok()?;
    let mut buf = vec![0u8; SNIFF];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) => return None,
        }
    }
    buf.truncate(got);
    describe_bytes(&buf)
}

/// [`describe_file`] on the first bytes of a file.
pub(super) fn describe_bytes(b: &[u8]) -> Option<String> {
    const CONVERT: &str = "convert it to safetensors (transformers: \
        `model.save_pretrained(dir, safe_serialization=True)`; PyTorch: \
        `safetensors.torch.save_file(state_dict, \"model.safetensors\")`) and pass that";
    if b.starts_with(b"PK\x03\x04") || b.starts_with(b"PK\x05\x06") {
        return Some(format!(
            "it is a ZIP archive (a PyTorch checkpoint written by torch.save is one): {CONVERT}"
        ));
    }
    // Pickle protocol 2 to 5 opens with PROTO and its number.
    if b.len() >= 2 && b[0] == 0x80 && (2..=5).contains(&b[1]) {
        return Some(format!(
            "it is a Python pickle (an older PyTorch checkpoint, `pytorch_model.bin`): {CONVERT}"
        ));
    }
    if b.starts_with(b"GGUF") {
        return Some(
            "it is a GGUF file (llama.cpp's format), which loads by its own name: pass the file \
             with a .gguf name (the first part of a split), not as a safetensors file or shard"
                .into(),
        );
    }
    if b.starts_with(b"\x1f\x8b") {
        return Some(
            "it is gzip-compressed: unpack it (gunzip, or tar -xzf for a .tar.gz) and pass \
             the model.safetensors or the folder inside"
                .into(),
        );
    }
    if b.starts_with(b"\x89HDF") {
        return Some(
            "it is an HDF5 file (a Keras .h5 checkpoint): convert it to safetensors and pass that"
                .into(),
        );
    }
    if b.starts_with(b"\x93NUMPY") {
        return Some(
            "it is a NumPy .npy array: save the tensors with safetensors' save_file and pass that"
                .into(),
        );
    }
    let text = text_prefix(b)?;
    let start = text.trim_start();
    let lower = start.to_ascii_lowercase();
    Some(if start.starts_with("version https://git-lfs") {
        "it is a Git LFS pointer, not the weights (the repository was cloned without \
         `git lfs`): run `git lfs pull` in its folder, or download the file itself"
            .into()
    } else if lower.starts_with("<!doctype html") || lower.starts_with("<html") {
        "it is an HTML page (a download that fetched a web page instead of the file): \
         download the file itself (Hugging Face: a /resolve/ URL, not /blob/)"
            .into()
    } else if start.starts_with('{') {
        "it is a JSON text file, not a safetensors file: for a sharded checkpoint pass the \
         folder holding model.safetensors.index.json and its shards"
            .into()
    } else {
        format!(
            "it is a text file (it begins `{}`), not a safetensors file: pass a .safetensors \
             file, a .gguf file, or a folder holding model.safetensors.index.json or \
             model.safetensors",
            first_line(start).escape_debug()
        )
    })
}

/// The bytes as text when they are UTF-8 text (a multi-byte character cut at
/// the end of the sample allowed) with no control characters but whitespace.
fn text_prefix(b: &[u8]) -> Option<&str> {
    if b.is_empty() {
        return None;
    }
    let s = match std::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => {
            std::str::from_utf8(&b[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    s.chars()
        .all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t'))
        .then_some(s)
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(40).collect();
    if line.chars().count() > 40 {
        out.push_str("...");
    }
    out
}

/// Why the folder `dir`, which holds neither an index nor
/// `model.safetensors`, cannot be loaded, with what to pass instead.
pub(super) fn describe_folder(dir: &Path, index_file: &str) -> String {
    let mut gguf = Vec::new();
    let mut safetensors = Vec::new();
    let mut pickles = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let lower = name.to_ascii_lowercase();
            if lower.ends_with(".gguf") {
                gguf.push(name);
            } else if lower.ends_with(".safetensors") {
                safetensors.push(name);
            } else if [".bin", ".pt", ".pth", ".ckpt"]
                .iter()
                .any(|x| lower.ends_with(x))
            {
                pickles.push(name);
            }
        }
    }
    for v in [&mut gguf, &mut safetensors, &mut pickles] {
        v.sort();
    }
    let base = format!("folder holds neither {index_file} nor model.safetensors");
    let list = |v: &[String]| {
        let shown: Vec<String> = v
            .iter()
            .take(4)
            .map(|n| format!("`{}`", n.escape_debug()))
            .collect();
        let more = v.len().saturating_sub(4);
        if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    };
    if !gguf.is_empty() {
        let first = gguf
            .iter()
            .find(|n| n.contains("-00001-of-"))
            .unwrap_or(&gguf[0]);
        format!(
            "{base}; it holds GGUF {} {}: pass the file itself, e.g. {}",
            if gguf.len() == 1 { "file" } else { "files" },
            list(&gguf),
            dir.join(first).display()
        )
    } else if !safetensors.is_empty() {
        format!(
            "{base}; it holds {}: pass one of them, or add the {index_file} that lists \
             the shards of one checkpoint",
            list(&safetensors)
        )
    } else if !pickles.is_empty() {
        format!(
            "{base}; it holds {}, PyTorch pickle checkpoints, which this loader does not \
             read: convert them to safetensors (transformers: \
             `save_pretrained(dir, safe_serialization=True)`)",
            list(&pickles)
        )
    } else {
        format!("{base}, nor any .safetensors or .gguf file: pass a checkpoint file or the folder that holds one")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_format_by_its_first_bytes() {
        let cases: [(&[u8], &str); 9] = [
            (b"PK\x03\x04\x14\x00rest", "ZIP archive"),
            (b"\x80\x02}q\x00(X", "Python pickle"),
            (b"GGUF\x03\x00\x00\x00", "GGUF file"),
            (b"\x1f\x8b\x08\x00", "gzip"),
            (
                b"version https://git-lfs.github.com/spec/v1\noid sha256:ab",
                "Git LFS pointer",
            ),
            (b"<!DOCTYPE html><html>", "HTML page"),
            (b"{\"weight_map\": {}}", "JSON text file"),
            (
                b"hello world\nsecond line",
                "text file (it begins `hello world`)",
            ),
            (b"\x89HDF\r\n\x1a\n", "HDF5"),
        ];
        for (bytes, want) in cases {
            let got = describe_bytes(bytes).unwrap_or_default();
            assert!(got.contains(want), "{bytes:?}: {got}");
        }
    }

    #[test]
    fn says_nothing_of_binary_it_does_not_know() {
        // A safetensors header length followed by JSON, and random bytes.
        assert_eq!(describe_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}"), None);
        assert_eq!(describe_bytes(&[0xde, 0xad, 0xbe, 0xef, 0, 1, 2]), None);
        assert_eq!(describe_bytes(b""), None);
    }

    #[test]
    fn text_cut_inside_a_character_is_still_text() {
        let s = "température".as_bytes();
        assert!(text_prefix(&s[..3]).is_some());
        assert!(text_prefix(&s[..5]).is_some()); // the é cut in half
    }
}
