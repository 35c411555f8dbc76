//! A file or folder that is not a checkpoint is named for what it is, with
//! what to pass instead: a ZIP or pickle saved by PyTorch, a Git LFS
//! pointer, an HTML page, text, a GGUF file listed as a safetensors shard,
//! a folder holding only a .gguf file or only pickles.

use crate::common;

use std::path::Path;

use common::loader::*;
use vmmweights::loader::*;
use vmmweights::Status;

fn refused(path: &Path, needles: &[&str]) {
    let e = Checkpoint::open(path)
        .err()
        .unwrap_or_else(|| panic!("{} opened", path.display()));
    assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "the error does not name {}: {msg}",
        path.display()
    );
    for n in needles {
        assert!(msg.contains(n), "missing `{n}` in: {msg}");
    }
    assert!(
        !msg.contains("header length"),
        "a length read from text: {msg}"
    );
}

#[test]
fn files_named_safetensors_that_are_something_else() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &[&str]); 7] = [
        (
            "zip.safetensors",
            b"PK\x03\x04\x14\x00\x00\x00\x08\x00archive/data.pkl....",
            &[
                "not a safetensors file",
                "ZIP archive",
                "torch.save",
                "save_pretrained",
            ],
        ),
        (
            "pickle.safetensors",
            b"\x80\x02}q\x00(X\x06\x00\x00\x00weightq\x01ctorch._utils",
            &["Python pickle", "safetensors.torch.save_file"],
        ),
        (
            "lfs.safetensors",
            b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 16\n",
            &["Git LFS pointer", "git lfs pull"],
        ),
        (
            "page.safetensors",
            b"<!DOCTYPE html>\n<html lang=\"en\"><head><title>model</title>",
            &["HTML page", "/resolve/"],
        ),
        (
            "notes.safetensors",
            b"These are my notes about the model, not weights at all.\n",
            &[
                "text file",
                "begins `These are my notes",
                "pass a .safetensors file, a .gguf file",
            ],
        ),
        (
            "config.safetensors",
            b"{\"hidden_size\": 4096}\n",
            &["JSON text file", "index.json"],
        ),
        // Shorter than the 8-byte length: still named, not "too short".
        ("hi.safetensors", b"hi\n", &["text file"]),
    ];
    for (name, bytes, needles) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        refused(&p, needles);
    }
}

#[test]
fn a_gguf_file_listed_as_a_safetensors_shard() {
    let dir = tempfile::tempdir().unwrap();
    let t = generate(&SMALL, Dtype::Bf16);
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    // The second shard replaced by a GGUF file under the shard's name.
    let g = common::gguf::File::new(Vec::new(), &[("w", &[4], 0, vec![0u8; 16])]);
    let shard = dir.path().join("model-00002-of-00002.safetensors");
    g.write(&shard);
    let e = Checkpoint::open(dir.path()).expect_err("opened");
    let msg = e.to_string();
    assert!(msg.contains("model-00002-of-00002.safetensors"), "{msg}");
    assert!(msg.contains("GGUF file") && msg.contains(".gguf"), "{msg}");
}

#[test]
fn folders_without_safetensors_say_what_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    // Only a GGUF file: the error names it, with its full path to pass.
    let only_gguf = dir.path().join("gguf-only");
    std::fs::create_dir(&only_gguf).unwrap();
    let g = common::gguf::File::new(Vec::new(), &[("w", &[4], 0, vec![0u8; 16])]);
    g.write(&only_gguf.join("model-Q8_0.gguf"));
    let e = Checkpoint::open(&only_gguf).expect_err("opened");
    let msg = e.to_string();
    let file = only_gguf.join("model-Q8_0.gguf").display().to_string();
    assert!(
        msg.contains("GGUF file `model-Q8_0.gguf`") && msg.contains(&file),
        "{msg}"
    );
    // And passing that file loads it.
    Checkpoint::open(&file).expect("the file the error names opens");

    // A split GGUF: the first part is the one to pass.
    let split = dir.path().join("gguf-split");
    std::fs::create_dir(&split).unwrap();
    for part in ["m-00002-of-00002.gguf", "m-00001-of-00002.gguf"] {
        g.write(&split.join(part));
    }
    let msg = Checkpoint::open(&split).expect_err("opened").to_string();
    assert!(
        msg.contains(&split.join("m-00001-of-00002.gguf").display().to_string()),
        "{msg}"
    );

    // Pickles only.
    let pickles = dir.path().join("pickles");
    std::fs::create_dir(&pickles).unwrap();
    std::fs::write(pickles.join("pytorch_model.bin"), b"\x80\x02}q\x00.").unwrap();
    let msg = Checkpoint::open(&pickles).expect_err("opened").to_string();
    assert!(
        msg.contains("`pytorch_model.bin`") && msg.contains("pickle"),
        "{msg}"
    );

    // Safetensors under other names, without an index.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let t = generate(&SMALL, Dtype::Bf16);
    write_file(&other.join("consolidated.safetensors"), &t, Dtype::Bf16);
    let msg = Checkpoint::open(&other).expect_err("opened").to_string();
    assert!(
        msg.contains("`consolidated.safetensors`: pass one of them"),
        "{msg}"
    );

    // Nothing at all.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let msg = Checkpoint::open(&empty).expect_err("opened").to_string();
    assert!(
        msg.contains("neither") && msg.contains("nor any .safetensors or .gguf file"),
        "{msg}"
    );
}

#[test]
fn a_damaged_safetensors_file_keeps_its_precise_error() {
    // Binary that is no known format: the header checks' own message.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.safetensors");
    let mut b = (1u64 << 40).to_le_bytes().to_vec();
    b.extend_from_slice(&[0u8; 64]);
    std::fs::write(&p, b).unwrap();
    let msg = Checkpoint::open(&p).expect_err("opened").to_string();
    assert!(
        msg.contains("header length 1099511627776 runs past the end"),
        "{msg}"
    );
    // A good sharded checkpoint beside them still opens.
    let ok = dir.path().join("ok");
    std::fs::create_dir(&ok).unwrap();
    let t = generate(&SMALL, Dtype::Bf16);
    write_sharded(&ok, &t, Dtype::Bf16, 2);
    Checkpoint::open(&ok).expect("a good sharded checkpoint opens");
}
