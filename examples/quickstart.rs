//! vmmweights from Rust, the whole flow: open a backend, load a checkpoint in
//! place into pool memory under a tag, sleep (the memory behind the tensors
//! is released, their addresses kept), wake, and check that every tensor
//! holds the checkpoint's bytes at the address it had.
//!
//! ```sh
//! cargo run --release --example quickstart                   # a small checkpoint it writes
//! cargo run --release --example quickstart -- /models/qwen2  # a checkpoint of yours
//! VMMW_BACKEND=host cargo run --example quickstart           # no GPU: the host backend
//! ```
//!
//! In a crate of your own: `vmmweights = { path = "/path/to/vmmweights" }`
//! in `[dependencies]` (the library alone; none of the command line's crates).

use std::path::{Path, PathBuf};

use vmmweights::driver::{self, BackendChoice};
use vmmweights::loader::{Destination, Session};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Pool, PoolConfig, Result};

fn main() {
    if let Err(e) = run() {
        eprintln!("quickstart: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("vmmw-quickstart-{}", std::process::id()));
    let path = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => write_checkpoint(&scratch)?,
    };

    // The backend: CUDA when a driver and device are found, else the host
    // simulation (VMMW_BACKEND=host|cuda|auto chooses).
    let opened = driver::open(BackendChoice::from_env()?, 0)?;
    println!("backend: {} ({})", opened.driver.describe(), opened.reason);
    let pool = Pool::new(opened.driver.clone(), PoolConfig::default())?;
    let weights = tag::id("weights")?;

    // One destination per tensor, allocated in the pool under the tag, then
    // filled in place from the file.
    let session = Session::open(&path)?;
    session.allocate(&pool, weights)?;
    let loaded = session.load(&pool, None)?;
    let dests = session.destinations();
    println!(
        "loaded {} tensors, {} bytes, from {} in {:.3} s",
        dests.len(),
        loaded.stats.bytes,
        path.display(),
        loaded.stats.seconds
    );
    let before = checksums(&pool, &dests)?;

    // Sleep: the tag's memory goes to a host backup and the device memory is
    // released; every pointer stays reserved.
    for c in pool.sleep(&[(weights, Policy::Offload)])? {
        println!(
            "sleep {}: {} bytes released in {:.4} s",
            c.name, c.report.physical_bytes, c.report.seconds
        );
    }
    // Wake: memory mapped again at the same addresses, the backup copied back.
    for c in pool.wake(&[weights])? {
        println!(
            "wake  {}: {} bytes restored in {:.4} s",
            c.name, c.report.copied_bytes, c.report.seconds
        );
    }
    let after = checksums(&pool, &session.destinations())?;
    if after != before {
        return Err(Error::InvalidState(
            "a tensor's bytes or address changed across sleep and wake".into(),
        ));
    }
    println!(
        "verified: all {} tensors hold the same bytes at the same addresses",
        dests.len()
    );
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// Each destination's name, address and a hash of its bytes read back.
fn checksums(pool: &Pool, dests: &[Destination]) -> Result<Vec<(String, u64, u64)>> {
    dests
        .iter()
        .map(|d| {
            let mut bytes = vec![0u8; d.bytes()];
            // SAFETY: the destination is awake and `bytes()` long, and nothing
            // frees or sleeps it while this reads.
            unsafe { pool.read(d.ptr, &mut bytes)? };
            let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
            Ok((d.name.clone(), d.ptr, h))
        })
        .collect()
}

/// A small bf16 checkpoint: two layers of a model, 8 MiB.
fn write_checkpoint(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let shapes: [(&str, [usize; 2]); 4] = [
        ("model.embed_tokens.weight", [1024, 1024]),
        ("model.layers.0.mlp.down_proj.weight", [1024, 1024]),
        ("model.layers.1.mlp.down_proj.weight", [1024, 1024]),
        ("lm_head.weight", [1024, 1024]),
    ];
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n = shape[0] * shape[1] * 2;
            let bytes = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
            (name.to_string(), shape.to_vec(), bytes)
        })
        .collect();
    let views = data
        .iter()
        .map(|(n, s, b)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::InvalidArgument(format!("tensor {n}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| Error::InvalidArgument(format!("writing {}: {e}", path.display())))?;
    Ok(path)
}
