//! Entry points of the fuzz targets (`fuzz/`), hidden from the docs.
//!
//! Each takes arbitrary bytes, runs one parser of untrusted input the way the
//! library runs it, and panics only when a promise the parser makes is broken
//! (an accepted checkpoint whose tensors leave the file, a plan that writes
//! outside its destinations, an error that does not name the file). Errors
//! are the expected outcome for most inputs. The same entries run on stable
//! in `tests/all/fuzz_corpus.rs`, over the corpus and every crash kept in
//! `fuzz/regressions/`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::loader::checkpoint::INDEX_FILE;
use crate::loader::{Checkpoint, Dtype, Plan, PlanOptions, Registry, Rules};

/// The bytes of a small valid safetensors file holding `tensors`
/// (`(name, dtype, shape)`, data filled with a counter). For seeds and fixtures.
pub fn tiny_safetensors(tensors: &[TinyTensor]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    for (name, dtype, shape) in tensors {
        let len = shape.iter().product::<usize>() * dtype.size();
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let mut text = serde_json::Value::Object(header).to_string();
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend((0..at).map(|i| i as u8));
    out
}

/// A file in memory (memfd), reachable by path through `/proc/self/fd`.
struct MemFile {
    file: File,
    path: PathBuf,
}

fn mem_file(bytes: &[u8]) -> MemFile {
    // SAFETY: the name is a valid NUL-terminated string.
    let fd = unsafe { libc::memfd_create(c"vmmw-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nothing else.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes).expect("writing the memfd");
    MemFile {
        file,
        path: PathBuf::from(format!("/proc/self/fd/{fd}")),
    }
}

/// The promises an opened checkpoint keeps: every tensor inside its shard,
/// sized as its shape says, and no two tensors sharing a byte.
fn check_checkpoint(ckpt: &Checkpoint) {
    let mut by_shard: BTreeMap<usize, Vec<(u64, u64, &str)>> = BTreeMap::new();
    for (name, t) in &ckpt.tensors {
        assert_eq!(name, &t.name);
        let shard = &ckpt.shards[t.shard];
        let end = t.offset.checked_add(t.len).expect("offset + len overflows");
        // A packed file's tensors keep their offsets in the original file.
        assert!(
            end <= shard.original_len(),
            "tensor `{name}` ends at {end}, past the file's {} bytes",
            shard.original_len()
        );
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        let want = t.dtype.bytes(&shape);
        assert_eq!(
            want,
            Some(t.len),
            "tensor `{name}`: shape {:?} vs {} bytes",
            t.shape,
            t.len
        );
        if shard.packed.is_none() {
            assert_eq!(
                ckpt.tensor_bytes(name).map(<[u8]>::len),
                Some(t.len as usize)
            );
        }
        by_shard
            .entry(t.shard)
            .or_default()
            .push((t.offset, end, name));
    }
    for list in by_shard.values_mut() {
        list.sort();
        for w in list.windows(2) {
            assert!(
                w[0].1 <= w[1].0 || w[0].0 == w[0].1 || w[1].0 == w[1].1,
                "tensors `{}` and `{}` overlap",
                w[0].2,
                w[1].2
            );
        }
    }
}

fn check_error_names(e: &crate::Error, path: &Path) {
    let msg = e.to_string();
    let p = path.display().to_string();
    assert!(msg.contains(&p), "the error does not name `{p}`: {msg}");
}

/// One safetensors file: header length, header JSON, entries, offsets.
#[doc(hidden)]
pub fn fuzz_safetensors_header(data: &[u8]) {
    let f = mem_file(data);
    match Checkpoint::open(&f.path) {
        Ok(ckpt) => check_checkpoint(&ckpt),
        Err(e) => check_error_names(&e, &f.path),
    }
    drop(f.file);
}

/// A tensor of a generated file: name, dtype, shape.
pub type TinyTensor<'a> = (&'a str, Dtype, &'a [usize]);

/// The shards every index input is resolved against.
const INDEX_SHARDS: [(&str, &[TinyTensor]); 3] = [
    (
        "model-00001-of-00002.safetensors",
        &[("a", Dtype::F32, &[2, 2]), ("b", Dtype::Bf16, &[3])],
    ),
    (
        "model-00002-of-00002.safetensors",
        &[("c", Dtype::U8, &[5])],
    ),
    ("sub/d.safetensors", &[("d", Dtype::F16, &[1, 4])]),
];

/// Make the fixed shards of the index target inside `dir`.
pub fn write_index_shards(dir: &Path) -> std::io::Result<()> {
    for (name, tensors) in INDEX_SHARDS {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, tiny_safetensors(tensors))?;
    }
    Ok(())
}

/// An index (`model.safetensors.index.json`) in `dir`, resolved against the
/// shards [`write_index_shards`] made there.
#[doc(hidden)]
pub fn fuzz_index_in(dir: &Path, data: &[u8]) {
    std::fs::write(dir.join(INDEX_FILE), data).expect("writing the index");
    match Checkpoint::open(dir) {
        Ok(ckpt) => {
            check_checkpoint(&ckpt);
            for s in &ckpt.shards {
                assert!(
                    s.path.starts_with(dir),
                    "shard {} is outside {}",
                    s.path.display(),
                    dir.display()
                );
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&dir.display().to_string()),
                "the error names no file: {msg}"
            );
        }
    }
}

/// [`fuzz_index_in`] in a folder of this process, made on first use.
#[doc(hidden)]
pub fn fuzz_index(data: &[u8]) {
    static DIR: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut dir = DIR.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir.get_or_insert_with(|| {
        let d = std::env::temp_dir().join(format!("vmmw-fuzz-index-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("creating the index fuzz folder");
        write_index_shards(&d).expect("writing the index shards");
        d
    });
    fuzz_index_in(d, data);
}

/// Names every rule input is tried on.
const SOURCE_NAMES: [&str; 6] = [
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.12.mlp.up_proj.weight",
    "model.embed_tokens.weight",
    "lm_head.weight",
    "",
    "a.b",
];

/// The rules JSON: parse, round trip, compile, map.
#[doc(hidden)]
pub fn fuzz_rules(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(rules) = Rules::from_json(text) else {
        return;
    };
    let back = Rules::from_json(&rules.to_json()).expect("serialized rules parse again");
    assert_eq!(back, rules, "rules change across a JSON round trip");
    if let Ok(c) = rules.compile() {
        for n in SOURCE_NAMES {
            let _ = c.map(n);
        }
    }
}

/// The built-in checkpoint of the planner target: a one-layer Llama shape.
pub fn planner_checkpoint() -> Vec<u8> {
    tiny_safetensors(&[
        ("model.embed_tokens.weight", Dtype::Bf16, &[8, 4]),
        (
            "model.layers.0.self_attn.q_proj.weight",
            Dtype::Bf16,
            &[4, 4],
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            Dtype::Bf16,
            &[2, 4],
        ),
        (
            "model.layers.0.self_attn.v_proj.weight",
            Dtype::Bf16,
            &[2, 4],
        ),
        (
            "model.layers.0.self_attn.o_proj.weight",
            Dtype::Bf16,
            &[4, 4],
        ),
        ("model.layers.0.mlp.gate_proj.weight", Dtype::F32, &[6, 4]),
        ("model.layers.0.mlp.up_proj.weight", Dtype::F32, &[6, 4]),
        ("model.layers.0.mlp.down_proj.weight", Dtype::F16, &[4, 6]),
        ("model.layers.0.input_layernorm.weight", Dtype::F32, &[4]),
        ("model.norm.weight", Dtype::F32, &[4]),
    ])
}

/// Largest destination the planner target registers (a fake address range).
const PLAN_DEST_LIMIT: u64 = 1 << 40;

/// Checkpoint + rules -> destinations -> plan. Input: rules JSON, a 0 byte,
/// then a safetensors file (the built-in [`planner_checkpoint`] when empty).
/// An accepted plan reads only inside its source tensors and writes only
/// inside its destinations.
#[doc(hidden)]
pub fn fuzz_plan(data: &[u8]) {
    let (rules_bytes, file) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(rules_bytes) else {
        return;
    };
    let Ok(rules) = Rules::from_json(text) else {
        return;
    };
    let builtin;
    let file = if file.is_empty() {
        builtin = planner_checkpoint();
        &builtin[..]
    } else {
        file
    };
    let f = mem_file(file);
    let Ok(ckpt) = Checkpoint::open(&f.path) else {
        return;
    };
    let Ok(specs) = Plan::destinations(&ckpt, &rules) else {
        return;
    };
    // Fake, disjoint device addresses: the plan is only computed, never run.
    let mut reg = Registry::new();
    let mut at: u64 = 1 << 32;
    for s in &specs {
        let shape: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
        let bytes = s.dtype.bytes(&shape).unwrap_or_else(|| {
            panic!(
                "destination `{}` {:?}: byte size overflows",
                s.name, s.shape
            )
        });
        if bytes > PLAN_DEST_LIMIT {
            return;
        }
        reg.register(&s.name, at, s.dtype, &s.shape)
            .unwrap_or_else(|e| panic!("registering a planned destination: {e}"));
        at += bytes.max(1).div_ceil(256) * 256;
    }
    let opts = PlanOptions {
        allow_missing: true,
        allow_unexpected: true,
    };
    let Ok(plan) = Plan::build(&ckpt, &rules, &reg, &opts) else {
        return;
    };
    let dests: Vec<(u64, u64)> = reg
        .iter()
        .map(|d| (d.ptr, d.ptr + d.bytes() as u64))
        .collect();
    let inside = |lo: u64, hi: u64| dests.iter().any(|&(a, b)| a <= lo && hi <= b);
    for e in &plan.extents {
        let name = &plan.sources[e.source as usize];
        // A tie's extents read the tensor it is tied to.
        let t = ckpt
            .tensor(name)
            .or_else(|| {
                let tie = rules.ties.iter().find(|t| &t.to == name)?;
                ckpt.tensor(&tie.from)
            })
            .unwrap_or_else(|| panic!("extent names unknown source `{name}`"));
        if e.height == 0 || e.width == 0 {
            continue;
        }
        let src_end = e.src + e.src_pitch * (e.height - 1) + e.width;
        assert!(
            e.src >= t.offset && src_end <= t.offset + t.len,
            "extent {e:?} reads outside `{name}` [{}, {})",
            t.offset,
            t.offset + t.len
        );
        let dst_end = e.dst + e.dst_pitch * (e.height - 1) + e.dst_width();
        assert!(
            inside(e.dst, dst_end),
            "extent {e:?} writes outside every destination"
        );
    }
    for fill in &plan.fills {
        assert!(
            fill.len == 0 || inside(fill.dst, fill.dst + fill.len),
            "fill {fill:?} writes outside every destination"
        );
    }
    drop(f.file);
}

/// The share manifest another process sends (JSON of a `Hello`): parse, then
/// validate for both backends and two granularities. An accepted layout
/// covers exactly its chunks and every tensor lies inside them, sized as its
/// shape says.
#[doc(hidden)]
pub fn fuzz_share_manifest(data: &[u8]) {
    use crate::driver::BackendKind;
    use crate::share::manifest::Hello;
    let Ok(Hello::Manifest(m)) = serde_json::from_slice::<Hello>(data) else {
        return;
    };
    for backend in [BackendKind::Host, BackendKind::Cuda] {
        for granularity in [4096usize, 2 << 20] {
            let Ok(layout) = m.validate(backend, granularity) else {
                continue;
            };
            assert_eq!(layout.chunks.len(), m.chunks.len());
            let sum: u64 = m.chunks.iter().sum();
            assert_eq!(
                layout.total as u64, sum,
                "total is not the sum of the chunks"
            );
            assert!(layout.chunks.iter().all(|&c| c > 0 && c % granularity == 0));
            assert_eq!(layout.tensor_bytes.len(), m.tensors.len());
            for (t, &bytes) in m.tensors.iter().zip(&layout.tensor_bytes) {
                let want = t.dtype.bytes(&t.shape);
                assert_eq!(want, Some(bytes as u64), "tensor `{}` size", t.name);
                let end = t.offset.checked_add(bytes as u64).expect("end overflows");
                assert!(end <= sum, "tensor `{}` ends at {end}, past {sum}", t.name);
            }
        }
    }
}

/// The wire, client side: a hostile owner sends `data[1..]` as is, then
/// `data[0] % 4` memfds of 64 KiB (unsealed when bit 2 of `data[0]` is set),
/// then the end of the handshake, then closes. The attach succeeds with a
/// layout that matches what was sent, or fails with a share error; either way
/// the importer holds no handle, mapping, reservation or descriptor after.
#[doc(hidden)]
pub fn fuzz_share_client(data: &[u8]) {
    use crate::driver::host::{HostConfig, HostDriver};
    use crate::driver::Driver;
    use crate::share::{wire, AttachOptions, Attachment};
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::os::unix::net::UnixListener;
    use std::time::Duration;

    const G: usize = 64 << 10;
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let dir = tempfile_dir();
    let path = dir.join(format!("client-{}", unique()));
    let listener = UnixListener::bind(&path).expect("binding the fuzz socket");
    let bytes = bytes.to_vec();
    let owner = std::thread::spawn(move || {
        let Ok((s, _)) = listener.accept() else {
            return;
        };
        let _ = wire::send_all(&s, &bytes, None);
        let fds: Vec<OwnedFd> = (0..mode % 4)
            .map(|_| {
                let flags = if mode & 4 != 0 {
                    0
                } else {
                    libc::MFD_ALLOW_SEALING
                };
                // SAFETY: a valid NUL-terminated name.
                let fd = unsafe { libc::memfd_create(c"fuzz".as_ptr(), libc::MFD_CLOEXEC | flags) };
                assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
                // SAFETY: `fd` was just created and is owned by nothing else.
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                // SAFETY: sizing and sealing the memfd just created.
                unsafe {
                    libc::ftruncate(fd.as_raw_fd(), G as libc::off_t);
                    libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK);
                }
                fd
            })
            .collect();
        let b: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let _ = wire::send_fds(&s, &b, None);
        let _ = wire::send_all(&s, b"E", None);
    });
    let driver = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    let options = AttachOptions {
        timeout: Duration::from_secs(2),
        ..AttachOptions::default()
    };
    match Attachment::attach(driver.clone() as Arc<dyn Driver>, &path, &options) {
        Ok(a) => {
            let m = a.manifest().clone();
            let (_, total) = a.range();
            assert_eq!(total as u64, m.chunks.iter().sum::<u64>());
            assert_eq!(a.len(), m.tensors.len());
            for t in a.tensors().unwrap_or_default() {
                let mut buf = vec![0u8; t.bytes.min(64)];
                a.read(t.ptr, &mut buf)
                    .expect("a tensor of an accepted share reads");
            }
            a.detach().expect("detach");
        }
        Err(e) => {
            let s = e.status();
            assert!(
                matches!(
                    s,
                    crate::Status::ShareRefused
                        | crate::Status::InvalidArgument
                        | crate::Status::Io
                ),
                "an owner's bytes gave {s:?}: {e}"
            );
        }
    }
    let c = driver.counts();
    assert_eq!(
        (c.handles, c.mappings, c.reservations),
        (0, 0, 0),
        "the importer keeps nothing after an attach ends"
    );
    let _ = owner.join();
    let _ = std::fs::remove_file(&path);
}

/// The wire, server side: a hostile importer connects to a running share,
/// sends `data` and closes its writing end, then reads what comes back. The
/// owner answers with a refusal, or a manifest, one descriptor per chunk and
/// the end of the handshake; and it stops counting the connection once the
/// importer has gone.
#[doc(hidden)]
pub fn fuzz_share_server(data: &[u8]) {
    use crate::share::manifest::Hello;
    use crate::share::wire;
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    let server = fuzz_server();
    // Each connection's handshake runs on a thread of its own, which may
    // still be exiting when the answer is in; the input ends once it is gone
    // (else the sanitizer counts the thread's exit bookkeeping as a leak).
    let threads = || {
        std::fs::read_dir("/proc/self/task")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = threads();
    let s = UnixStream::connect(server.path()).expect("connecting to the fuzz share");
    let _ = wire::send_all(&s, data, None);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let deadline = Some(Instant::now() + Duration::from_secs(5));
    let mut fds = Vec::new();
    match wire::read_hello(&s, &mut fds, deadline) {
        Ok(Hello::Refused(why)) => {
            assert!(!why.is_empty());
            assert!(fds.is_empty(), "descriptors came with a refusal");
        }
        Ok(Hello::Manifest(m)) => {
            assert!(
                data.first().is_some_and(|&b| b == b'r' || b == b'w'),
                "a manifest for the request {:?}",
                data.first()
            );
            let mut byte = [0u8; 1];
            while fds.len() < m.chunks.len() {
                wire::recv_exact(&s, &mut byte, &mut fds, deadline).expect("every descriptor");
            }
            assert_eq!(fds.len(), m.chunks.len(), "one descriptor per chunk");
        }
        // The owner may cut a connection that sent bytes after its request.
        Err(e) => assert!(data.len() > 1, "no answer to {data:?}: {e}"),
    }
    drop(fds);
    drop(s);
    let until = Instant::now() + Duration::from_secs(10);
    while server.attached() > 0 {
        assert!(
            Instant::now() < until,
            "the owner still counts a closed connection"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    while threads() > before {
        assert!(
            Instant::now() < until,
            "a handshake thread outlived its connection"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmmw-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("creating the fuzz socket folder");
    d
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// One share for the whole fuzz run: two tensors in a host pool.
fn fuzz_server() -> &'static crate::share::Server {
    use crate::driver::host::{HostConfig, HostDriver};
    use crate::loader::registry::Destination;
    use crate::pool::{Pool, PoolConfig};
    use crate::share::{LogSink, ServeOptions, Server};
    use std::sync::OnceLock;

    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let driver = Arc::new(HostDriver::new(HostConfig {
            granularity: 64 << 10,
            memory_limit: 1 << 30,
        }));
        let pool = Arc::new(Pool::new(driver, PoolConfig::default()).expect("a host pool"));
        let tag = crate::tag::id("fuzz-share").expect("a tag");
        let tensors = [("a", 1000usize), ("b", 70_000)]
            .into_iter()
            .map(|(name, n)| Destination {
                name: name.into(),
                ptr: pool.alloc_tagged(n * 4, tag).expect("an allocation").ptr,
                dtype: Dtype::F32,
                shape: vec![n],
            })
            .collect();
        let path = tempfile_dir().join(format!("server-{}", unique()));
        Server::start(
            pool,
            tag,
            tensors,
            path,
            ServeOptions {
                allow_write: true,
                handshake_timeout: std::time::Duration::from_secs(2),
                log: LogSink::discard(),
                ..ServeOptions::default()
            },
        )
        .expect("serving the fuzz share")
    })
}

/// One GGUF file opened as a checkpoint: header, metadata, tensor infos,
/// alignment, offsets; what opens keeps the checkpoint promises, every
/// tensor's data is aligned, and planning it with the identity rules does
/// not panic.
#[doc(hidden)]
pub fn fuzz_gguf_header(data: &[u8]) {
    let f = mem_file(data);
    match Checkpoint::open(&f.path) {
        Ok(ckpt) => {
            check_checkpoint(&ckpt);
            if let Some(g) = ckpt.gguf() {
                let file = &g.files[0];
                for t in ckpt.tensors.values() {
                    assert!(
                        (t.offset - file.data_start).is_multiple_of(file.alignment),
                        "tensor `{}` at {} is not aligned to {}",
                        t.name,
                        t.offset,
                        file.alignment
                    );
                }
            }
            let _ = Plan::destinations(&ckpt, &Rules::default());
        }
        Err(e) => check_error_names(&e, &f.path),
    }
}

/// The GGUF header parser alone, then every metadata value read back
/// through the access paths the C API uses (types, typed getters, every
/// array element, nested arrays).
#[doc(hidden)]
pub fn fuzz_gguf_metadata(data: &[u8]) {
    use crate::loader::gguf::{parse_header, ValueRef};
    let Ok(h) = parse_header(data) else {
        return;
    };
    let mut keys = std::collections::HashSet::new();
    for (k, _) in &h.metadata.entries {
        assert!(keys.insert(k), "key `{k}` twice");
    }
    for t in &h.tensors {
        let end = t.offset.checked_add(t.len).expect("end overflows");
        assert!(end <= data.len() as u64, "tensor `{}` past the end", t.name);
    }
    fn walk(
        m: &crate::loader::gguf::Metadata,
        i: usize,
        path: &mut Vec<usize>,
        budget: &mut usize,
    ) {
        let v = m.at(i, path).expect("a path built from lengths resolves");
        let _ = (v.as_u64(), v.as_i64(), v.as_f64(), v.as_bool(), v.as_str());
        let _ = v.value_type();
        if let ValueRef::Value(x) = v {
            let _ = x.to_string();
        }
        if let Some(a) = v.array() {
            for j in 0..a.len() {
                if *budget == 0 {
                    return;
                }
                *budget -= 1;
                path.push(j);
                walk(m, i, path, budget);
                path.pop();
            }
            assert!(m.at(i, &[path.as_slice(), &[a.len()]].concat()).is_err());
        }
    }
    let mut budget = 1 << 16;
    for i in 0..h.metadata.len() {
        walk(&h.metadata, i, &mut Vec::new(), &mut budget);
    }
    assert!(h.metadata.at(h.metadata.len(), &[]).is_err());
}

/// The backup codec's decoder on hostile frames. The first byte picks what
/// the rest is:
/// - even: a frame, decoded to the length its header names (up to 1 MiB):
///   the decoder returns, never panics, never writes outside its output;
/// - odd: `[layout, n, n × (position u16, xor u8), raw...]`: the raw bytes are
///   encoded, the bytes at those positions changed, and the frame decoded;
///   an accepted frame must give back exactly the raw bytes (a changed byte
///   passes only when the checksum collides, about 2^-64 per block).
pub fn fuzz_codec_frame(data: &[u8]) {
    use crate::codec::{self, Layout};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let Ok(len) = codec::raw_len(rest) else {
            return;
        };
        if len > 1 << 20 {
            return;
        }
        let mut out = vec![0u8; len as usize];
        let _ = codec::decode(rest, &mut out);
        return;
    }
    let [sel, n, rest @ ..] = rest else {
        return;
    };
    let layout = [Layout::Bytes, Layout::Half, Layout::Single][*sel as usize % 3];
    let n = *n as usize % 8;
    if rest.len() < 3 * n {
        return;
    }
    let (hits, raw) = rest.split_at(3 * n);
    let mut frame = codec::encode(raw, layout);
    for h in hits.chunks_exact(3) {
        let at = u16::from_le_bytes([h[0], h[1]]) as usize % frame.len();
        frame[at] ^= h[2];
    }
    let mut out = vec![0u8; raw.len()];
    if codec::decode(&frame, &mut out).is_ok() {
        assert!(out == raw, "a changed frame decoded to different bytes");
    }
}

/// A packed file (docs/PACKED.md): preamble, manifest checksum, kept header,
/// pieces and frames. What opens keeps the checkpoint promises (offsets in
/// the original file), each tensor's bytes decode on the host to exactly its
/// length or fail with an error naming the file, and planning with the
/// identity rules does not panic.
///
/// The first byte picks how the rest is used: even, as it is; odd, with the
/// manifest checksum in the preamble recomputed first, so mutations reach
/// the checks behind it (a forged header with a valid checksum).
#[doc(hidden)]
pub fn fuzz_packed_header(data: &[u8]) {
    use crate::loader::packed::format::{manifest_sum, PREAMBLE_BYTES};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut data = rest.to_vec();
    if mode % 2 == 1 && data.len() >= PREAMBLE_BYTES {
        let m = u64::from_le_bytes(data[40..48].try_into().expect("8 bytes"));
        let end = (PREAMBLE_BYTES as u64).saturating_add(m);
        if end <= data.len() as u64 {
            let sum = manifest_sum(&data[..56], &data[PREAMBLE_BYTES..end as usize]);
            data[56..64].copy_from_slice(&sum.to_le_bytes());
        }
    }
    let f = mem_file(&data);
    match Checkpoint::open(&f.path) {
        Ok(ckpt) => {
            check_checkpoint(&ckpt);
            for name in ckpt.tensors.keys() {
                match ckpt.read_tensor(name) {
                    Ok(b) => assert_eq!(b.len() as u64, ckpt.tensors[name].len),
                    Err(e) => check_error_names(&e, &f.path),
                }
            }
            let _ = Plan::destinations(&ckpt, &Rules::default());
        }
        Err(e) => check_error_names(&e, &f.path),
    }
    drop(f.file);
}
