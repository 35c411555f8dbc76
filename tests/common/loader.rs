//! Shared helpers for the loader tests: generated Llama-like checkpoints,
//! host-backend destinations filled with a pattern, device reads.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use safetensors::tensor::TensorView;
use safetensors::Dtype as StDtype;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::loader::{Checkpoint, Dtype, Plan, Registry, Rules, SegmentAllocator};
use vmmweights::{DevicePtr, Driver};

pub const PATTERN: u8 = 0xA5;

/// Model shape for generated checkpoints.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub layers: usize,
    pub hidden: usize,
    pub inter: usize,
    pub vocab: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub tied: bool,
    pub qk_norm: bool,
}

pub const SMALL: Shape = Shape {
    layers: 2,
    hidden: 64,
    inter: 96,
    vocab: 120,
    heads: 4,
    kv_heads: 2,
    head_dim: 16,
    tied: false,
    qk_norm: true,
};

/// (name, shape) of every tensor of a Llama/Qwen3-like model with HF names.
pub fn tensor_shapes(s: &Shape) -> Vec<(String, Vec<usize>)> {
    let mut v = vec![(
        "model.embed_tokens.weight".to_owned(),
        vec![s.vocab, s.hidden],
    )];
    for l in 0..s.layers {
        let p = format!("model.layers.{l}");
        v.push((format!("{p}.input_layernorm.weight"), vec![s.hidden]));
        v.push((
            format!("{p}.post_attention_layernorm.weight"),
            vec![s.hidden],
        ));
        v.push((
            format!("{p}.self_attn.q_proj.weight"),
            vec![s.heads * s.head_dim, s.hidden],
        ));
        v.push((
            format!("{p}.self_attn.k_proj.weight"),
            vec![s.kv_heads * s.head_dim, s.hidden],
        ));
        v.push((
            format!("{p}.self_attn.v_proj.weight"),
            vec![s.kv_heads * s.head_dim, s.hidden],
        ));
        v.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![s.hidden, s.heads * s.head_dim],
        ));
        if s.qk_norm {
            v.push((format!("{p}.self_attn.q_norm.weight"), vec![s.head_dim]));
            v.push((format!("{p}.self_attn.k_norm.weight"), vec![s.head_dim]));
        }
        v.push((format!("{p}.mlp.gate_proj.weight"), vec![s.inter, s.hidden]));
        v.push((format!("{p}.mlp.up_proj.weight"), vec![s.inter, s.hidden]));
        v.push((format!("{p}.mlp.down_proj.weight"), vec![s.hidden, s.inter]));
    }
    v.push(("model.norm.weight".to_owned(), vec![s.hidden]));
    if !s.tied {
        v.push(("lm_head.weight".to_owned(), vec![s.vocab, s.hidden]));
    }
    v
}

fn st_dtype(d: Dtype) -> StDtype {
    match d {
        Dtype::Bf16 => StDtype::BF16,
        Dtype::F16 => StDtype::F16,
        Dtype::F32 => StDtype::F32,
        Dtype::U8 => StDtype::U8,
        other => panic!("test generator does not write {other}"),
    }
}

/// Deterministic, finite values (so conversions are meaningful), as bytes of `dtype`.
pub fn values(seed: u64, n: usize, dtype: Dtype) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let f = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
        match dtype {
            Dtype::Bf16 => out.extend(half::bf16::from_f32(f).to_bits().to_le_bytes()),
            Dtype::F16 => out.extend(half::f16::from_f32(f).to_bits().to_le_bytes()),
            Dtype::F32 => out.extend(f.to_le_bytes()),
            Dtype::U8 => out.push(x as u8),
            other => panic!("{other}"),
        }
    }
    out
}

/// Generated tensors: name -> (shape, bytes).
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<u8>)>;

pub fn generate(s: &Shape, dtype: Dtype) -> Tensors {
    tensor_shapes(s)
        .into_iter()
        .enumerate()
        .map(|(i, (n, sh))| {
            let numel = sh.iter().product();
            (n, (sh, values(i as u64 + 1, numel, dtype)))
        })
        .collect()
}

/// Write `tensors` as one file.
pub fn write_file(path: &Path, tensors: &Tensors, dtype: Dtype) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (sh, b))| {
            (
                n.clone(),
                TensorView::new(st_dtype(dtype), sh.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Write `tensors` as `shards` files plus `model.safetensors.index.json`.
pub fn write_sharded(dir: &Path, tensors: &Tensors, dtype: Dtype, shards: usize) {
    let names: Vec<&String> = tensors.keys().collect();
    let per = names.len().div_ceil(shards);
    let mut weight_map = BTreeMap::new();
    for (k, chunk) in names.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", k + 1, shards);
        let part: Tensors = chunk
            .iter()
            .map(|n| ((*n).clone(), tensors[*n].clone()))
            .collect();
        write_file(&dir.join(&file), &part, dtype);
        for n in chunk {
            weight_map.insert((*n).clone(), file.clone());
        }
    }
    write_index(dir, &weight_map);
}

pub fn write_index(dir: &Path, weight_map: &BTreeMap<String, String>) {
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

pub fn host() -> Arc<dyn Driver> {
    Arc::new(HostDriver::new(HostConfig::default()))
}

/// Destinations for every tensor `rules` map `ckpt` to, allocated from one
/// segment of `bytes` (keep the allocator alive as long as the registry).
pub fn allocate_for(
    d: &Arc<dyn Driver>,
    ckpt: &Checkpoint,
    rules: &Rules,
    bytes: usize,
) -> (SegmentAllocator, Registry) {
    let alloc = SegmentAllocator::new(d.clone(), bytes);
    let mut reg = Registry::new();
    reg.allocate(&Plan::destinations(ckpt, rules).unwrap(), &alloc)
        .unwrap();
    (alloc, reg)
}

/// Fill every destination with `PATTERN`.
pub fn fill_pattern(d: &dyn Driver, reg: &Registry) {
    for dst in reg.iter() {
        // SAFETY: destinations were allocated on this driver and are mapped.
        unsafe {
            d.memset_async(
                dst.ptr,
                PATTERN,
                dst.bytes(),
                vmmweights::driver::StreamId::DEFAULT,
            )
        }
        .unwrap();
    }
    d.synchronize().unwrap();
}

/// Read `len` device bytes.
pub fn read(d: &dyn Driver, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: the range is a mapped destination; `v` has `len` bytes.
    unsafe { vmmweights::driver::sync_copy::copy_to_host(d, &mut v, ptr) }.unwrap();
    v
}

/// Every destination still holds `PATTERN`.
pub fn untouched(d: &dyn Driver, reg: &Registry) -> bool {
    reg.iter()
        .all(|dst| read(d, dst.ptr, dst.bytes()).iter().all(|&b| b == PATTERN))
}

/// Rows `[a, a+n)` along `dim` (0 or 1) of a 2D (or 1D for dim 0) row-major tensor.
pub fn slice(
    shape: &[usize],
    bytes: &[u8],
    elem: usize,
    dim: usize,
    a: usize,
    n: usize,
) -> Vec<u8> {
    if shape.len() == 1 || dim == 0 {
        let row: usize = shape[1..].iter().product::<usize>() * elem;
        return bytes[a * row..(a + n) * row].to_vec();
    }
    let cols = shape[1];
    let mut out = Vec::new();
    for r in 0..shape[0] {
        let base = r * cols * elem;
        out.extend_from_slice(&bytes[base + a * elem..base + (a + n) * elem]);
    }
    out
}
