//! How one destination is laid out from its parts (slices of checkpoint
//! tensors, fused along a dimension, padded), and the copies and zero fills
//! that lay it out: box copies cut into 2D extents, in units of blocks for
//! quantized tensors.

use super::checkpoint::TensorInfo;
use super::dtype::Dtype;
use super::registry::byte_size;
use super::rules::{Fuse, Pad, Shard, Tp};
use crate::driver::{ConvertType, DevicePtr};

/// One 2D copy: `height` rows of `width` source bytes, `src_pitch` apart in the
/// shard file and `dst_pitch` apart on the device. Converted on the device when
/// `convert` is set (then a row is `width / from.size() * to.size()` bytes on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Shard index in the checkpoint.
    pub shard: u32,
    /// Absolute file offset of the first row.
    pub src: u64,
    /// Bytes between rows in the file.
    pub src_pitch: u64,
    /// Source bytes per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
    /// Device address of the first row.
    pub dst: DevicePtr,
    /// Bytes between rows on the device.
    pub dst_pitch: u64,
    /// Element conversion `(from, to)`.
    pub convert: Option<(ConvertType, ConvertType)>,
    /// Index into [`Plan::sources`](super::plan::Plan::sources) (for messages).
    pub source: u32,
}

impl Extent {
    /// Device bytes per row.
    pub fn dst_width(&self) -> u64 {
        match self.convert {
            Some((f, t)) => self.width / f.size() as u64 * t.size() as u64,
            None => self.width,
        }
    }

    /// Source bytes moved.
    pub fn src_bytes(&self) -> u64 {
        self.width * self.height
    }

    /// Device bytes written.
    pub fn dst_bytes(&self) -> u64 {
        self.dst_width() * self.height
    }
}

/// A zero fill of device memory (padding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// Device address.
    pub dst: DevicePtr,
    /// Bytes.
    pub len: u64,
}

/// Most copies (and, separately, zero fills) one plan may hold: 16 Mi, about
/// 1 GiB of plan. Sharding a 405B model by columns needs about 4 Mi; a
/// checkpoint and rules that cut finer are refused before anything is
/// allocated for them, instead of exhausting memory.
pub const MAX_PIECES: usize = 1 << 24;

/// One source feeding (a slice of) a destination.
pub(super) struct Part {
    pub(super) source: String,
    pub(super) tie: bool,
    pub(super) info: TensorInfo,
    pub(super) slice_start: Vec<usize>,
    pub(super) slice_len: Vec<usize>,
    pub(super) fuse: Option<Fuse>,
    pub(super) pad: Option<Pad>,
    /// Offset along the fuse dim, computed in `layout`.
    pub(super) offset: usize,
}

#[derive(Default)]
pub(super) struct DestGroup {
    pub(super) parts: Vec<Part>,
    pub(super) shape: Vec<usize>,
    /// (dim, covered length) when the destination is padded.
    pub(super) pad_region: Option<(usize, usize)>,
    pub(super) error: Option<String>,
}

impl DestGroup {
    /// The destination's shape in elements (`shape` counts a quantized
    /// tensor's last dimension in blocks).
    pub(super) fn elem_shape(&self) -> Vec<usize> {
        let block = self.parts.first().map_or(1, |p| p.info.dtype.block());
        let mut s = self.shape.clone();
        if let Some(l) = s.last_mut() {
            *l *= block;
        }
        s
    }

    pub(super) fn describe(&self) -> String {
        self.parts
            .iter()
            .map(|p| {
                format!(
                    "`{}` {:?} sliced to {:?}",
                    p.source, p.info.shape, p.slice_len
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Turn a quantized tensor's shape and slice into units of blocks along the
/// last dimension; refuse what is not exact on raw blocks.
pub(super) fn to_blocks(
    info: &mut TensorInfo,
    start: &mut [usize],
    len: &mut [usize],
    fuse: &Option<Fuse>,
    pad: &Option<Pad>,
) -> std::result::Result<(), String> {
    if fuse.is_some() || pad.is_some() {
        return Err(
            "a quantized tensor can be renamed, skipped, tied or row-sliced, not fused or padded"
                .into(),
        );
    }
    let b = info.dtype.block();
    let Some(last) = info.shape.len().checked_sub(1) else {
        return Err("a quantized tensor needs at least one dimension".into());
    };
    if !start[last].is_multiple_of(b) || !len[last].is_multiple_of(b) {
        return Err(format!(
            "the slice {}..{} of dim {last} does not fall on whole blocks of {b} elements",
            start[last],
            start[last] + len[last]
        ));
    }
    info.shape[last] /= b;
    start[last] /= b;
    len[last] /= b;
    Ok(())
}

/// `shape` with its last dimension counted in blocks of `block` elements.
pub(super) fn unit_shape(shape: &[usize], block: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(l) = s.last_mut() {
        *l /= block;
    }
    s
}

/// The tensor-parallel slice of `shape` for this rank: (start, len) per dim.
pub(super) fn slice(
    shape: &[usize],
    shard: Option<&Shard>,
    tp: Option<Tp>,
) -> std::result::Result<(Vec<usize>, Vec<usize>), String> {
    let start = vec![0; shape.len()];
    let len = shape.to_vec();
    let (Some(s), Some(tp)) = (shard, tp) else {
        return Ok((start, len));
    };
    let (mut start, mut len) = (start, len);
    if s.dim >= shape.len() {
        return Err(format!(
            "shard dim {} but the tensor has {} dims",
            s.dim,
            shape.len()
        ));
    }
    let size = shape[s.dim];
    let (a, l) = match s.head_dim {
        Some(hd) => {
            if hd == 0 || !size.is_multiple_of(hd) {
                return Err(format!(
                    "dim {} of {size} is not a whole number of heads of {hd}",
                    s.dim
                ));
            }
            let heads = size / hd;
            if tp.world <= heads {
                if !heads.is_multiple_of(tp.world) {
                    return Err(format!(
                        "{heads} heads do not split over {} ranks",
                        tp.world
                    ));
                }
                let per = heads / tp.world;
                (tp.rank * per * hd, per * hd)
            } else {
                if tp.world % heads != 0 {
                    return Err(format!(
                        "{} ranks are not a multiple of {heads} heads (needed to replicate them)",
                        tp.world
                    ));
                }
                let head = tp.rank / (tp.world / heads);
                (head * hd, hd)
            }
        }
        None => {
            if !size.is_multiple_of(tp.world) {
                return Err(format!(
                    "dim {} of {size} does not split over {} ranks",
                    s.dim, tp.world
                ));
            }
            let per = size / tp.world;
            (tp.rank * per, per)
        }
    };
    start[s.dim] = a;
    len[s.dim] = l;
    Ok((start, len))
}

/// Order fused parts, compute their offsets, the destination shape and padding.
pub(super) fn layout(g: &mut DestGroup) -> std::result::Result<(), String> {
    let fused = g.parts.iter().filter(|p| p.fuse.is_some()).count();
    if fused == 0 && g.parts.len() > 1 {
        return Err(format!(
            "fed by several sources without a fuse rule ({})",
            g.describe()
        ));
    }
    if fused > 0 && fused != g.parts.len() {
        return Err(format!(
            "some parts are fused and some not ({})",
            g.describe()
        ));
    }
    let rank = g.parts[0].slice_len.len();
    if g.parts.iter().any(|p| p.slice_len.len() != rank) {
        return Err(format!("parts have different ranks ({})", g.describe()));
    }
    let mut shape = g.parts[0].slice_len.clone();
    if fused > 0 {
        let dim = g.parts[0].fuse.as_ref().map_or(0, |f| f.dim);
        if g.parts
            .iter()
            .any(|p| p.fuse.as_ref().map(|f| f.dim) != Some(dim))
        {
            return Err(format!(
                "parts fuse along different dims ({})",
                g.describe()
            ));
        }
        g.parts
            .sort_by_key(|p| p.fuse.as_ref().map_or(0, |f| f.index));
        let mut next = 0;
        for i in 0..g.parts.len() {
            if i > 0
                && g.parts[i].fuse.as_ref().map(|f| f.index)
                    == g.parts[i - 1].fuse.as_ref().map(|f| f.index)
            {
                return Err(format!(
                    "`{}` and `{}` have the same fuse index",
                    g.parts[i - 1].source,
                    g.parts[i].source
                ));
            }
            let p = &mut g.parts[i];
            p.offset = p.fuse.as_ref().and_then(|f| f.offset).unwrap_or(next);
            next = p.offset.checked_add(p.slice_len[dim]).ok_or_else(|| {
                format!(
                    "`{}`: fuse offset {} plus {} elements along dim {dim} overflows",
                    p.source, p.offset, p.slice_len[dim]
                )
            })?;
        }
        for p in &g.parts {
            for (d, (&have, &want)) in p.slice_len.iter().zip(&shape).enumerate() {
                if d != dim && have != want {
                    return Err(format!(
                        "parts disagree on dim {d} ({}), only dim {dim} may differ",
                        g.describe()
                    ));
                }
            }
        }
        // Coverage along the fuse dim: exactly once, no gaps.
        let mut iv: Vec<(usize, usize, &str)> = g
            .parts
            .iter()
            .map(|p| (p.offset, p.offset + p.slice_len[dim], p.source.as_str()))
            .collect();
        iv.sort_unstable();
        let mut end = 0;
        for (a, b, s) in &iv {
            if *a < end {
                return Err(format!(
                    "`{s}` overlaps another part at {a}..{end} along dim {dim}"
                ));
            }
            if *a > end {
                return Err(format!(
                    "elements {end}..{a} along dim {dim} are fed by no source"
                ));
            }
            end = *b;
        }
        shape[dim] = end;
    }
    if let Some(pad) = g.parts.iter().find_map(|p| p.pad.clone()) {
        if pad.dim >= rank {
            return Err(format!(
                "pad dim {} but the destination has {rank} dims",
                pad.dim
            ));
        }
        let covered = shape[pad.dim];
        let padded = pad.padded(covered).ok_or_else(|| {
            format!(
                "pad of dim {} ({covered} elements) to a multiple of {:?} overflows",
                pad.dim, pad.multiple_of
            )
        })?;
        if padded > covered {
            shape[pad.dim] = padded;
            g.pad_region = Some((pad.dim, covered));
        }
    }
    // Every size derived from the shape (bytes, strides, offsets) must fit:
    // 8 bytes is the largest element any destination can have.
    if byte_size(&shape, Dtype::F64).is_none() {
        return Err(format!(
            "destination shape {shape:?} is too large: its byte size overflows"
        ));
    }
    g.shape = shape;
    Ok(())
}

fn strides(shape: &[usize]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as u64;
    }
    s
}

/// Emit the 2D copies moving box `len` at `src_start` of the source tensor to
/// `dst_start` of the destination.
#[allow(clippy::too_many_arguments)]
pub(super) fn box_copy(
    src: &TensorInfo,
    src_start: &[usize],
    len: &[usize],
    dst: DevicePtr,
    dst_dtype: Dtype,
    dst_shape: &[usize],
    dst_start: &[usize],
    convert: Option<(ConvertType, ConvertType)>,
    source: u32,
    out: &mut Vec<Extent>,
) -> std::result::Result<(), String> {
    let n = len.len();
    if len.contains(&0) {
        return Ok(());
    }
    let (es, ed) = (src.dtype.size() as u64, dst_dtype.size() as u64);
    if n == 0 {
        out.push(Extent {
            shard: src.shard as u32,
            src: src.offset,
            src_pitch: es,
            width: es,
            height: 1,
            dst,
            dst_pitch: ed,
            convert,
            source,
        });
        return Ok(());
    }
    let (ss, ds) = (strides(&src.shape), strides(dst_shape));
    // k: the outermost dim from which the box is contiguous in both tensors.
    let mut k = n - 1;
    while k > 0 && len[k] == src.shape[k] && len[k] == dst_shape[k] {
        k -= 1;
    }
    let run = len[k] as u64 * ss[k]; // elements per contiguous run (inner dims are full)
    let (height, sp, dp) = if k == 0 {
        (1, run * es, run * ed)
    } else {
        (len[k - 1] as u64, ss[k - 1] * es, ds[k - 1] * ed)
    };
    // Iterate the dims before k-1 (or none).
    let outer_dims = k.saturating_sub(1);
    let pieces: usize = len[..outer_dims].iter().product();
    if out.len().saturating_add(pieces) > MAX_PIECES {
        return Err(too_fragmented(pieces));
    }
    let mut idx = vec![0usize; outer_dims];
    loop {
        let mut so = 0u64;
        let mut dof = 0u64;
        for d in 0..n {
            let i = if d < outer_dims { idx[d] } else { 0 };
            so += (src_start[d] + i) as u64 * ss[d];
            dof += (dst_start[d] + i) as u64 * ds[d];
        }
        let mut e = Extent {
            shard: src.shard as u32,
            src: src.offset + so * es,
            src_pitch: sp,
            width: run * es,
            height,
            dst: dst + dof * ed,
            dst_pitch: dp,
            convert,
            source,
        };
        if e.height > 1 && e.src_pitch == e.width && e.dst_pitch == e.dst_width() {
            e.width *= e.height;
            e.height = 1;
        }
        if e.height == 1 {
            e.src_pitch = e.width;
            e.dst_pitch = e.dst_width();
        }
        out.push(e);
        // Next outer index.
        let mut d = outer_dims;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < len[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Zero fills for the part of `shape` at or beyond `covered` along `dim`.
pub(super) fn pad_fills(
    dst: DevicePtr,
    dtype: Dtype,
    shape: &[usize],
    dim: usize,
    covered: usize,
    out: &mut Vec<Fill>,
) -> std::result::Result<(), String> {
    let st = strides(shape);
    let es = dtype.size() as u64;
    let outer: usize = shape[..dim].iter().product();
    let block = st[dim] * es;
    let pitch = shape[dim] as u64 * block;
    if covered == 0 {
        // Nothing comes from a source: one fill of the whole destination.
        out.push(Fill {
            dst,
            len: outer as u64 * pitch,
        });
        return Ok(());
    }
    if out.len().saturating_add(outer) > MAX_PIECES {
        return Err(too_fragmented(outer));
    }
    for o in 0..outer as u64 {
        let a = dst + o * pitch + covered as u64 * block;
        let len = (shape[dim] - covered) as u64 * block;
        match out.last_mut() {
            Some(f) if f.dst + f.len == a => f.len += len,
            _ => out.push(Fill { dst: a, len }),
        }
    }
    Ok(())
}

fn too_fragmented(pieces: usize) -> String {
    format!(
        "needs {pieces} more copies or fills, over the plan's limit of {MAX_PIECES}: the slicing or padding cuts it too finely"
    )
}
