//! Replays every fuzz input kept in the repository (the seed corpus in
//! `fuzz/corpus/<target>/` and every crash found, in `fuzz/regressions/<target>/`)
//! through the same entries the cargo-fuzz targets call, on stable. A panic
//! names the file that caused it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use vmmweights::fuzz;

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for kind in ["corpus", "regressions"] {
        let dir = root.join(kind).join(target);
        if let Ok(rd) = std::fs::read_dir(&dir) {
            out.extend(rd.map(|e| e.unwrap().path()).filter(|p| p.is_file()));
        }
    }
    out.sort();
    out
}

fn replay(target: &str, min: usize, entry: impl Fn(&[u8])) {
    let files = inputs(target);
    assert!(
        files.len() >= min,
        "fuzz/corpus/{target} holds {} inputs; expected at least {min}",
        files.len()
    );
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| entry(&data))) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{}: {msg}", f.display()));
        }
    }
    assert!(
        failed.is_empty(),
        "inputs that break a promise:\n{}",
        failed.join("\n")
    );
    println!("{target}: {} inputs replayed", files.len());
}

#[test]
fn safetensors_header_corpus() {
    replay("safetensors_header", 10, fuzz::fuzz_safetensors_header);
}

#[test]
fn index_corpus() {
    let dir = tempfile::tempdir().unwrap();
    fuzz::write_index_shards(dir.path()).unwrap();
    replay("index", 8, |d| fuzz::fuzz_index_in(dir.path(), d));
}

#[test]
fn rules_corpus() {
    replay("rules", 8, fuzz::fuzz_rules);
}

#[test]
fn planner_corpus() {
    replay("planner", 8, fuzz::fuzz_plan);
}

#[test]
fn share_manifest_corpus() {
    replay("share_manifest", 10, fuzz::fuzz_share_manifest);
}

/// The manifest seeds: the valid ones validate, the hostile ones are refused.
#[test]
fn manifest_seeds_are_accepted_or_refused_as_named() {
    use vmmweights::driver::BackendKind;
    use vmmweights::share::manifest::Hello;
    for f in inputs("share_manifest") {
        let name = f.file_name().unwrap().to_str().unwrap().to_owned();
        let Ok(Hello::Manifest(m)) = serde_json::from_slice::<Hello>(&std::fs::read(&f).unwrap())
        else {
            continue;
        };
        let backend = if name.contains("cuda") {
            BackendKind::Cuda
        } else {
            BackendKind::Host
        };
        let r = m.validate(backend, 2 << 20);
        assert_eq!(r.is_ok(), name.starts_with("valid"), "{name}: {r:?}");
    }
}

/// Seeds that every version must refuse (the outcome of the others, such as
/// control characters in names, is the loader's validation policy, tested in
/// tests/all/loader_hostile.rs).
const MUST_REFUSE: [&str; 9] = [
    "header-len-max",
    "header-len-past-end",
    "offsets-past-end",
    "overlap",
    "shape-overflow",
    "nested-json",
    "non-utf8-name",
    "unknown-dtype",
    "short",
];

/// The seeds cover what they claim: valid inputs are accepted, hostile ones refused.
#[test]
fn seeds_are_accepted_or_refused_as_named() {
    use vmmweights::loader::Checkpoint;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/safetensors_header");
    for f in inputs("safetensors_header") {
        let name = f.file_name().unwrap().to_str().unwrap().to_owned();
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::copy(dir.join(&name), tmp.path()).unwrap();
        let r = Checkpoint::open(tmp.path());
        if name.starts_with("valid") {
            assert!(r.is_ok(), "{name}: {:?}", r.err());
        } else if MUST_REFUSE.contains(&name.as_str()) {
            let e = r.expect_err(&name).to_string();
            assert!(e.contains(&tmp.path().display().to_string()), "{name}: {e}");
        }
    }
}

#[test]
fn share_client_corpus() {
    replay("share_client", 10, fuzz::fuzz_share_client);
}

#[test]
fn share_server_corpus() {
    replay("share_server", 6, fuzz::fuzz_share_server);
}

/// Inputs mutated from `target`'s corpus with a fixed seed (byte flips,
/// cuts, insertions, splices): a bounded random run on stable, so the wire
/// is fuzzed from both sides in every test run, not only where nightly
/// cargo-fuzz runs. `VMMW_WIRE_FUZZ_RUNS` sets the count (default 300).
fn mutated(target: &str, seed: u64) -> Vec<Vec<u8>> {
    let runs: usize = std::env::var("VMMW_WIRE_FUZZ_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let seeds: Vec<Vec<u8>> = inputs(target)
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..runs)
        .map(|_| {
            let mut d = seeds[next() as usize % seeds.len()].clone();
            for _ in 0..1 + next() % 4 {
                let at = if d.is_empty() {
                    0
                } else {
                    next() as usize % d.len()
                };
                match next() % 5 {
                    0 if !d.is_empty() => d[at] ^= 1 << (next() % 8),
                    1 if !d.is_empty() => d[at] = next() as u8,
                    2 => d.truncate(at),
                    3 => d.insert(at.min(d.len()), next() as u8),
                    _ => {
                        let other = &seeds[next() as usize % seeds.len()];
                        let from = next() as usize % (other.len() + 1);
                        d.extend_from_slice(&other[from..]);
                    }
                }
            }
            d
        })
        .collect()
}

fn run_mutated(target: &str, seed: u64, entry: impl Fn(&[u8])) {
    let cases = mutated(target, seed);
    for (i, d) in cases.iter().enumerate() {
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| entry(d))) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{target} mutated input {i} ({d:02x?}) breaks a promise: {msg}");
        }
    }
    println!("{target}: {} mutated inputs", cases.len());
}

#[test]
fn share_client_random_run() {
    run_mutated("share_client", 0x5eed_c11e, fuzz::fuzz_share_client);
}

#[test]
fn codec_frame_random_run() {
    run_mutated("codec_frame", 0x5eed_c0de, fuzz::fuzz_codec_frame);
}

#[test]
fn share_server_random_run() {
    run_mutated("share_server", 0x5eed_5e7e, fuzz::fuzz_share_server);
}

#[test]
fn gguf_header_corpus() {
    replay("gguf_header", 10, fuzz::fuzz_gguf_header);
}

#[test]
fn gguf_metadata_corpus() {
    replay("gguf_metadata", 10, fuzz::fuzz_gguf_metadata);
}

#[test]
fn codec_frame_corpus() {
    replay("codec_frame", 8, fuzz::fuzz_codec_frame);
}

#[test]
fn packed_header_corpus() {
    replay("packed_header", 8, fuzz::fuzz_packed_header);
}

#[test]
fn packed_header_random_run() {
    run_mutated("packed_header", 0x5eed_9ac4, fuzz::fuzz_packed_header);
}
