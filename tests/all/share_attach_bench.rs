//! One owner process, one importer process, the same bytes: the attach
//! sharing benchmark, on whichever backend `VMMW_BACKEND` picks.
//!
//! In CI (host backend) it shares about 10 MB of synthetic tensors. On a GPU
//! (`VMMW_BACKEND=cuda`) it loads the checkpoint in `VMMW_SHARE_CKPT` (the
//! 16.4 GB 8B-shaped one) with the qwen3 preset, or fills 16.4 GB of
//! synthetic tensors when that is unset; the importer may use another device
//! (`VMMW_SHARE_IMPORT_DEVICE`, peer access over NVLink). Both sides checksum
//! every tensor through device-to-host copies; the importer reports its
//! attach time. Prints one line `share-bench {json}`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use vmmweights::driver::{self, BackendChoice, BackendKind, Driver, StreamId};
use vmmweights::loader::{
    allocate_in_pool, load_into_pool, Checkpoint, Control, Destination, Dtype, LoadOptions, Plan,
    Registry, Rules,
};
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::share::{AttachOptions, Attachment, ServeOptions, Server};
use vmmweights::tag;

/// A checksum of `bytes` bytes at device address `ptr`, read back in pieces.
/// Each piece is hashed in 16 parallel parts and folded in order, so the
/// result only depends on the bytes.
fn device_checksum(d: &Arc<dyn Driver>, ptr: u64, bytes: usize, buf: &mut [u8]) -> u64 {
    let mut h: u64 = 0x243f6a8885a308d3;
    let mut off = 0;
    while off < bytes {
        let n = (bytes - off).min(buf.len());
        // SAFETY: `buf` holds `n` writable bytes; the source is mapped device memory.
        unsafe {
            d.copy_dtoh_async(buf.as_mut_ptr(), ptr + off as u64, n, StreamId::DEFAULT)
                .unwrap()
        };
        d.stream_synchronize(StreamId::DEFAULT).unwrap();
        let part = n.div_ceil(16).max(1);
        let parts: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = buf[..n]
                .chunks(part)
                .map(|c| {
                    s.spawn(move || {
                        let mut x: u64 = 0x9e3779b97f4a7c15;
                        let mut words = c.chunks_exact(8);
                        for w in &mut words {
                            let v = u64::from_le_bytes(w.try_into().unwrap());
                            x = (x ^ v).wrapping_mul(0x100000001b3).rotate_left(29);
                        }
                        for &b in words.remainder() {
                            x = (x ^ b as u64).wrapping_mul(0x100000001b3);
                        }
                        x
                    })
                })
                .collect();
            hs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for p in parts {
            h = (h ^ p).wrapping_mul(0x100000001b3).rotate_left(17);
        }
        off += n;
    }
    h
}

fn checksum_all(d: &Arc<dyn Driver>, tensors: &mut [(String, u64, usize)]) -> String {
    tensors.sort();
    let mut buf = vec![0u8; 256 << 20];
    let mut h: u64 = 0;
    for (_, ptr, bytes) in tensors.iter() {
        h = (h ^ device_checksum(d, *ptr, *bytes, &mut buf)).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

fn open(device: i32) -> Arc<dyn Driver> {
    driver::open(BackendChoice::from_env().unwrap(), device)
        .unwrap()
        .driver
}

/// The importer process: attach, checksum, report.
#[test]
fn importer() {
    let Ok(path) = std::env::var("VMMW_SHARE_BENCH_PATH") else {
        return;
    };
    let device: i32 = std::env::var("VMMW_SHARE_IMPORT_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let d = open(device);
    let t0 = Instant::now();
    let a = Attachment::attach(d.clone(), &path, &AttachOptions::default()).unwrap();
    let attach_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut tensors: Vec<_> = a
        .tensors()
        .unwrap()
        .into_iter()
        .map(|t| (t.name, t.ptr, t.bytes))
        .collect();
    let t1 = Instant::now();
    let sum = checksum_all(&d, &mut tensors);
    let sum_s = t1.elapsed().as_secs_f64();
    let st = a.stats();
    let t2 = Instant::now();
    a.detach().unwrap();
    let detach_ms = t2.elapsed().as_secs_f64() * 1e3;
    // Later attaches in the same process: what the first one paid once.
    let mut again: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            let a = Attachment::attach(d.clone(), &path, &AttachOptions::default()).unwrap();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            a.detach().unwrap();
            ms
        })
        .collect();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "@importer sum={sum} attach_ms={attach_ms:.2} detach_ms={detach_ms:.2} checksum_s={sum_s:.2} tensors={} device={device} \
         chunks={} handshake_ms={:.2} import_map_ms={:.2} access_ms={:.2} again_ms={:.2}",
        tensors.len(),
        st.chunks,
        st.handshake.as_secs_f64() * 1e3,
        st.import_map.as_secs_f64() * 1e3,
        st.access.as_secs_f64() * 1e3,
        median(&mut again),
    );
}

/// The owner: load or fill, serve, run the importer, compare.
#[test]
fn owner_serves_and_importer_checksums_equal() {
    if std::env::var("VMMW_SHARE_BENCH_PATH").is_ok() {
        return;
    }
    let d = match driver::open(BackendChoice::from_env().unwrap(), 0) {
        Ok(o) => o.driver,
        Err(e @ vmmweights::Error::DriverUnavailable(_)) => {
            eprintln!("SKIP: no usable CUDA driver: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let cuda = d.kind() == BackendKind::Cuda;
    if !d.shareable() {
        eprintln!("SKIP: the {} backend here cannot export memory", d.kind());
        return;
    }
    let pool = Arc::new(Pool::new(d.clone(), PoolConfig::default()).unwrap());
    let t = tag::id("share-bench").unwrap();
    let t0 = Instant::now();
    let mut reg = Registry::new();
    let source = match std::env::var("VMMW_SHARE_CKPT") {
        Ok(dir) if cuda => {
            let ckpt = Checkpoint::open(&dir).unwrap();
            let rules = Rules::preset("qwen3", None, 128).unwrap();
            let specs = Plan::destinations(&ckpt, &rules).unwrap();
            allocate_in_pool(&mut reg, &specs, &pool, t).unwrap();
            load_into_pool(
                &pool,
                ckpt,
                &rules,
                &reg,
                &LoadOptions::default(),
                &Control::default(),
            )
            .unwrap();
            format!("checkpoint {dir}")
        }
        _ => {
            // Synthetic: 8B-shaped on a GPU (16.4 GB), 64 MiB in CI.
            let (layers, hidden, inter, vocab) = if cuda {
                (36usize, 4096usize, 12288usize, 151936usize)
            } else {
                (4, 256, 768, 4096)
            };
            let mut specs = vec![
                ("model.embed_tokens.weight".to_string(), vec![vocab, hidden]),
                ("lm_head.weight".to_string(), vec![vocab, hidden]),
                ("model.norm.weight".to_string(), vec![hidden]),
            ];
            for l in 0..layers {
                let p = format!("model.layers.{l}");
                specs.push((
                    format!("{p}.qkv_proj.weight"),
                    vec![6144 * hidden / 4096, hidden],
                ));
                specs.push((format!("{p}.o_proj.weight"), vec![hidden, hidden]));
                specs.push((format!("{p}.gate_up_proj.weight"), vec![2 * inter, hidden]));
                specs.push((format!("{p}.down_proj.weight"), vec![hidden, inter]));
                specs.push((format!("{p}.input_layernorm.weight"), vec![hidden]));
            }
            for (i, (name, shape)) in specs.into_iter().enumerate() {
                let bytes = shape.iter().product::<usize>() * 2;
                let b = pool.alloc_tagged(bytes, t).unwrap();
                // SAFETY: the block is mapped and `bytes` long.
                unsafe {
                    d.memset_async(b.ptr, (i * 37 + 11) as u8, bytes, StreamId::DEFAULT)
                        .unwrap()
                };
                reg.register(&name, b.ptr, Dtype::Bf16, &shape).unwrap();
            }
            d.synchronize().unwrap();
            "synthetic".to_string()
        }
    };
    let load_s = t0.elapsed().as_secs_f64();
    let tensors: Vec<Destination> = reg.iter().cloned().collect();
    let total: usize = tensors.iter().map(|x| x.bytes()).sum();
    let mut mine: Vec<_> = tensors
        .iter()
        .map(|x| (x.name.clone(), x.ptr, x.bytes()))
        .collect();
    let owner_sum = checksum_all(&d, &mut mine);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.sock");
    let server = Server::start(pool.clone(), t, tensors, &path, ServeOptions::default()).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "share_attach_bench::importer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VMMW_SHARE_BENCH_PATH", &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the importer failed");
    let line = BufReader::new(&out.stdout[..])
        .lines()
        .map_while(|l| l.ok())
        .find_map(|l| l.split_once("@importer ").map(|(_, r)| r.to_owned()))
        .expect("the importer reported");
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        field("sum"),
        owner_sum,
        "the importer reads the owner's bytes"
    );
    // The owner's connection thread sees the importer gone shortly after it exits.
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while server.attached() != 0 {
        assert!(
            Instant::now() < deadline,
            "the exited importer is still counted"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    println!(
        "share-bench {{\"backend\": \"{}\", \"source\": \"{source}\", \"bytes\": {total}, \"tensors\": {}, \
         \"load_s\": {load_s:.2}, \"attach_ms\": {}, \"detach_ms\": {}, \"importer_checksum_s\": {}, \
         \"import_device\": {}, \"chunks\": {}, \"handshake_ms\": {}, \"import_map_ms\": {}, \
         \"access_ms\": {}, \"again_ms\": {}, \"checksums_equal\": true}}",
        d.kind(),
        mine.len(),
        field("attach_ms"),
        field("detach_ms"),
        field("checksum_s"),
        field("device"),
        field("chunks"),
        field("handshake_ms"),
        field("import_map_ms"),
        field("access_ms"),
        field("again_ms"),
    );
}
