//! The load plan: every copy extent computed before any I/O.
//!
//! Built from a checkpoint, mapping rules and the destinations. Guarantees,
//! checked here and reported together in one [`Error::Plan`]:
//! - every destination byte is written by exactly one extent, or zero-filled (pad);
//! - every source tensor is loaded or explicitly skipped;
//! - shapes agree after slicing and fusing, and dtypes are equal or convertible
//!   (F16, BF16, F32 in any direction);
//! - missing destinations and unexpected sources are errors unless allowed;
//! - a ggml block-quantized tensor is renamed, skipped, tied or sliced by
//!   whole blocks only, never fused, padded or converted.
//!
//! Quantized tensors are planned in units of blocks: right after slicing, the
//! last (fastest) dimension of their shape and slice is divided by the block
//! size, so every copy (`layout.rs`) moves whole blocks of [`Dtype::size`](super::dtype::Dtype::size) bytes.

use std::collections::BTreeMap;

use super::checkpoint::{Checkpoint, TensorInfo};
use super::layout::{box_copy, layout, pad_fills, slice, to_blocks, unit_shape, DestGroup, Part};
pub use super::layout::{Extent, Fill, MAX_PIECES};
use super::registry::{DestSpec, Registry};
use super::rules::{CompiledRules, Mapping, Rules, Tp};
use crate::error::{Error, Result};

/// Options for building a plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Destinations no source fills are left untouched instead of an error.
    pub allow_missing: bool,
    /// Sources with no destination are skipped instead of an error.
    pub allow_unexpected: bool,
}

/// A checked plan, ready to execute.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Copies, ordered by shard and file offset.
    pub extents: Vec<Extent>,
    /// Zero fills.
    pub fills: Vec<Fill>,
    /// Source tensor names, indexed by [`Extent::source`].
    pub sources: Vec<String>,
    /// Sources skipped by a rule.
    pub skipped: Vec<String>,
    /// Destinations left untouched (allowed missing).
    pub missing: Vec<String>,
    /// Sources skipped because nothing receives them (allowed unexpected).
    pub unexpected: Vec<String>,
}

impl Plan {
    /// Source bytes the plan reads.
    pub fn src_bytes(&self) -> u64 {
        self.extents.iter().map(Extent::src_bytes).sum()
    }

    /// Device bytes the plan writes (copies and fills).
    pub fn dst_bytes(&self) -> u64 {
        self.extents.iter().map(Extent::dst_bytes).sum::<u64>()
            + self.fills.iter().map(|f| f.len).sum::<u64>()
    }

    /// Build the plan for `registry`'s destinations.
    pub fn build(
        ckpt: &Checkpoint,
        rules: &Rules,
        registry: &Registry,
        opts: &PlanOptions,
    ) -> Result<Plan> {
        Plan::build_for(&ckpt.tensors, rules, registry, opts)
    }

    /// Build the plan for `registry`'s destinations from any set of named
    /// tensors: each [`TensorInfo::shard`] and [`TensorInfo::offset`] say
    /// where its bytes are, and every [`Extent`] reads from the same places
    /// (an update's sources number their tensors as shards at offset 0).
    pub fn build_for(
        tensors: &BTreeMap<String, TensorInfo>,
        rules: &Rules,
        registry: &Registry,
        opts: &PlanOptions,
    ) -> Result<Plan> {
        let groups = group(tensors, &rules.compile()?, rules.tp)?;
        let mut problems = Problems::default();
        let mut plan = Plan::default();
        let mut source_index: BTreeMap<String, u32> = BTreeMap::new();
        let filled_by = choose_among_aliases(&groups, registry);
        let mut alias_skipped = Vec::new();
        for (name, g) in &groups.dests {
            let chosen = filled_by.get(registry.primary(name));
            if chosen.is_some_and(|c| c != name) {
                // Another name of the same destination fills it.
                alias_skipped.extend(g.parts.iter().filter(|p| !p.tie).map(|p| p.source.clone()));
                continue;
            }
            let Some(dest) = registry.get(name) else {
                if g.parts.iter().all(|p| p.tie) {
                    continue; // a tie nobody receives
                }
                let srcs: Vec<&str> = g.parts.iter().map(|p| p.source.as_str()).collect();
                if opts.allow_unexpected {
                    plan.unexpected.extend(srcs.iter().map(|s| s.to_string()));
                } else {
                    problems
                        .unexpected
                        .push(format!("{} -> `{name}`", srcs.join(", ")));
                }
                continue;
            };
            if let Some(e) = &g.error {
                problems.mismatched.push(format!("`{name}`: {e}"));
                continue;
            }
            if g.elem_shape() != dest.shape {
                problems.mismatched.push(format!(
                    "`{name}`: destination shape {:?}, sources give {:?} ({})",
                    dest.shape,
                    g.elem_shape(),
                    g.describe()
                ));
                continue;
            }
            let mut convs = Vec::new();
            let mut ok = true;
            for p in &g.parts {
                let src = p.info.dtype;
                if src == dest.dtype {
                    convs.push(None);
                } else if src.is_quantized() || dest.dtype.is_quantized() {
                    problems.mismatched.push(format!(
                        "`{name}`: destination dtype {}, source `{}` is {src}: quantized tensors are copied as raw blocks and never converted",
                        dest.dtype, p.source
                    ));
                    ok = false;
                } else if let (Some(f), Some(t)) = (src.convert_type(), dest.dtype.convert_type()) {
                    convs.push(Some((f, t)));
                } else {
                    problems.mismatched.push(format!(
                        "`{name}`: destination dtype {}, source `{}` is {src} (only F16/BF16/F32 convert)",
                        dest.dtype, p.source
                    ));
                    ok = false;
                }
            }
            if !ok {
                continue;
            }
            let dest_units = unit_shape(&dest.shape, dest.dtype.block());
            for (p, conv) in g.parts.iter().zip(convs) {
                let next = source_index.len() as u32;
                let idx = *source_index.entry(p.source.clone()).or_insert(next);
                let dst_box_start = {
                    let mut s = vec![0; g.shape.len()];
                    if let Some(f) = &p.fuse {
                        s[f.dim] = p.offset;
                    }
                    s
                };
                if let Err(e) = box_copy(
                    &p.info,
                    &p.slice_start,
                    &p.slice_len,
                    dest.ptr,
                    dest.dtype,
                    &dest_units,
                    &dst_box_start,
                    conv,
                    idx,
                    &mut plan.extents,
                ) {
                    return Err(Error::Plan(format!("`{name}`: `{}` {e}", p.source)));
                }
            }
            if let Some((dim, covered)) = g.pad_region {
                pad_fills(
                    dest.ptr,
                    dest.dtype,
                    &dest.shape,
                    dim,
                    covered,
                    &mut plan.fills,
                )
                .map_err(|e| Error::Plan(format!("`{name}` padding {e}")))?;
            }
        }
        for d in registry.iter() {
            if !filled_by.contains_key(d.name.as_str()) {
                if opts.allow_missing {
                    plan.missing.push(d.name.clone());
                } else {
                    problems.missing.push(format!("`{}`", d.name));
                }
            }
        }
        problems.mismatched.extend(groups.problems);
        problems.into_result()?;
        plan.skipped = groups.skipped;
        plan.skipped.extend(alias_skipped);
        plan.sources = vec![String::new(); source_index.len()];
        for (n, i) in source_index {
            plan.sources[i as usize] = n;
        }
        plan.extents.sort_by_key(|e| (e.shard, e.src));
        Ok(plan)
    }

    /// The destinations the rules produce from `ckpt` (for the loader to
    /// allocate them). Element type: `rules.dtype`, else the source's.
    pub fn destinations(ckpt: &Checkpoint, rules: &Rules) -> Result<Vec<DestSpec>> {
        let groups = group(&ckpt.tensors, &rules.compile()?, rules.tp)?;
        let mut problems = Problems::default();
        let mut out = Vec::new();
        for (name, g) in &groups.dests {
            if let Some(e) = &g.error {
                problems.mismatched.push(format!("`{name}`: {e}"));
                continue;
            }
            let dt0 = g.parts[0].info.dtype;
            if let Some(to) = rules
                .dtype
                .filter(|&to| to != dt0 && (to.is_quantized() || dt0.is_quantized()))
            {
                problems.mismatched.push(format!(
                    "`{name}`: the rules' dtype {to} would convert {dt0}: quantized tensors are copied as raw blocks and never converted"
                ));
                continue;
            }
            if rules.dtype.is_none() && g.parts.iter().any(|p| p.info.dtype != dt0) {
                problems.mismatched.push(format!(
                    "`{name}`: parts have different dtypes ({}); set `dtype` in the rules",
                    g.describe()
                ));
                continue;
            }
            out.push(DestSpec {
                name: name.clone(),
                dtype: rules.dtype.unwrap_or(dt0),
                shape: g.elem_shape(),
            });
        }
        problems.mismatched.extend(groups.problems);
        problems.into_result()?;
        // Allocate in file order, so neighbours on disk are neighbours in memory.
        out.sort_by_key(|s| {
            let p = &groups.dests[&s.name].parts[0].info;
            (p.shard, p.offset)
        });
        Ok(out)
    }
}

#[derive(Default)]
struct Problems {
    missing: Vec<String>,
    unexpected: Vec<String>,
    mismatched: Vec<String>,
}

impl Problems {
    fn into_result(self) -> Result<()> {
        if self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty() {
            return Ok(());
        }
        let mut s = String::new();
        if !self.missing.is_empty() {
            s += &format!(
                "missing ({} destinations no checkpoint tensor fills): {}\n",
                self.missing.len(),
                self.missing.join(", ")
            );
        }
        if !self.unexpected.is_empty() {
            s += &format!(
                "unexpected ({} checkpoint tensors with no destination): {}\n",
                self.unexpected.len(),
                self.unexpected.join(", ")
            );
        }
        if !self.mismatched.is_empty() {
            s += &format!("mismatched ({}):\n", self.mismatched.len());
            for m in &self.mismatched {
                s += &format!("  {m}\n");
            }
        }
        Err(Error::Plan(s.trim_end().to_owned()))
    }
}

/// For each registered destination some group fills, the one group that
/// does (by the destination's listed name). Aliases give a destination several
/// names; a checkpoint tensor is preferred over a tie, then the listed name.
fn choose_among_aliases<'a>(
    groups: &'a Groups,
    registry: &'a Registry,
) -> BTreeMap<&'a str, &'a str> {
    let mut out: BTreeMap<&str, &str> = BTreeMap::new();
    let rank = |name: &str| {
        let tie = groups.dests[name].parts.iter().all(|p| p.tie);
        (tie, name != registry.primary(name))
    };
    for name in groups.dests.keys() {
        if registry.get(name).is_none() {
            continue;
        }
        let primary = registry.primary(name);
        match out.get(primary) {
            Some(cur) if rank(cur) <= rank(name) => {}
            _ => {
                out.insert(primary, name);
            }
        }
    }
    out
}

struct Groups {
    dests: BTreeMap<String, DestGroup>,
    skipped: Vec<String>,
    problems: Vec<String>,
}

/// Map every source through the rules and lay out each destination.
fn group(
    tensors: &BTreeMap<String, TensorInfo>,
    rules: &CompiledRules,
    tp: Option<Tp>,
) -> Result<Groups> {
    let mut sources: Vec<(String, bool, &TensorInfo)> =
        tensors.iter().map(|(n, t)| (n.clone(), false, t)).collect();
    let mut problems = Vec::new();
    for tie in &rules.rules.ties {
        if tensors.contains_key(&tie.to) {
            continue;
        }
        // Neither tensor present: nothing to tie (a missing destination reports it).
        if let Some(t) = tensors.get(&tie.from) {
            sources.push((tie.to.clone(), true, t));
        }
    }
    let mut dests: BTreeMap<String, DestGroup> = BTreeMap::new();
    let mut skipped = Vec::new();
    for (name, tie, info) in sources {
        match rules.map(&name) {
            Mapping::Skip => skipped.push(name),
            Mapping::Load {
                dest,
                fuse,
                shard,
                pad,
            } => {
                let (slice_start, slice_len) = match slice(&info.shape, shard.as_ref(), tp) {
                    Ok(s) => s,
                    Err(e) => {
                        problems.push(format!("`{name}` (shape {:?}): {e}", info.shape));
                        continue;
                    }
                };
                let mut info = info.clone();
                let (mut slice_start, mut slice_len) = (slice_start, slice_len);
                if info.dtype.is_quantized() {
                    if let Err(e) =
                        to_blocks(&mut info, &mut slice_start, &mut slice_len, &fuse, &pad)
                    {
                        problems.push(format!("`{name}` ({} {:?}): {e}", info.dtype, info.shape));
                        continue;
                    }
                }
                if let Some(f) = &fuse {
                    if f.dim >= info.shape.len() {
                        problems.push(format!(
                            "`{name}`: fuse dim {} but the tensor has {} dims",
                            f.dim,
                            info.shape.len()
                        ));
                        continue;
                    }
                }
                dests.entry(dest).or_default().parts.push(Part {
                    source: name,
                    tie,
                    info,
                    slice_start,
                    slice_len,
                    fuse,
                    pad,
                    offset: 0,
                });
            }
        }
    }
    for g in dests.values_mut() {
        if let Err(e) = layout(g) {
            g.error = Some(e);
        }
    }
    Ok(Groups {
        dests,
        skipped,
        problems,
    })
}
