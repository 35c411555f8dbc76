//! The update's plan: the load's plan ([`Plan::build_for`]) over the
//! source's manifest, each source tensor numbered as a shard whose bytes
//! start at offset 0, plus what an update refuses on top of a load (an
//! element conversion, a tag it cannot version) and the version check, all
//! listed in one error before any byte moves.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::resolved::Resolved;
use super::source::SourceTensor;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::loader::{Extent, Plan, PlanOptions, Registry, TensorInfo};
use crate::pool::Pool;
use crate::tag::{self, TagId};

/// Makes the load plan for a set of named tensors (the session's, kept
/// between updates, or one built at each call).
pub type PlanFor<'a> = &'a dyn Fn(&BTreeMap<String, TensorInfo>, &PlanOptions) -> Result<Arc<Plan>>;

/// The plan kept from an earlier update with these options, when its
/// tensors pass the test given (the session's, see
/// [`crate::loader::Session::kept_plan`]; None where nothing is kept).
pub type KeptPlan<'a> =
    &'a dyn Fn(&PlanOptions, &dyn Fn(&BTreeMap<String, TensorInfo>) -> bool) -> Option<Arc<Plan>>;

/// A checked update: the copies by source tensor and what they write.
#[derive(Debug, Clone)]
pub struct UpdatePlan {
    /// The load plan over the manifest.
    pub plan: Arc<Plan>,
    /// What the update derives from the plan alone: the extents by manifest
    /// entry, the destinations written.
    pub resolved: Arc<Resolved>,
    /// The tag whose version the update moves.
    pub tag: TagId,
}

/// Check the manifest against the destinations (the plan `plan_for` makes
/// from the manifest's tensors, as the load's rules map them) and the
/// version of the tag they live in; every problem in one error.
///
/// `tag`: the tag to version; None takes the one pool tag holding the
/// destinations written (an error when they span several, or lie outside
/// the pool).
#[allow(clippy::too_many_arguments)]
pub fn build(
    manifest: &[SourceTensor],
    plan_for: PlanFor<'_>,
    kept: KeptPlan<'_>,
    registry: &Registry,
    pool: &Pool,
    tag: Option<TagId>,
    expected: u64,
    opts: &PlanOptions,
) -> Result<UpdatePlan> {
    let mut problems: Vec<String> = Vec::new();
    let plan = match kept(opts, &|tensors| made_from(manifest, tensors)) {
        Some(plan) => Some(plan),
        None => plan_of(manifest, plan_for, opts, &mut problems)?,
    };
    let mut resolved = None;
    if let Some(plan) = &plan {
        let mut converted: Vec<&str> = plan
            .extents
            .iter()
            .filter(|e| e.convert.is_some())
            .map(|e| plan.sources[e.source as usize].as_str())
            .collect();
        converted.dedup();
        for name in converted {
            problems.push(format!(
                "`{name}`: its dtype differs from its destination's; an update copies bytes as they are (convert on the sender)"
            ));
        }
        resolved = Some(super::resolved::resolve(plan, manifest.len(), registry));
    }
    let written: &[(DevicePtr, usize, String)] = resolved.as_ref().map_or(&[], |r| &r.written);
    let tag = match tag {
        Some(t) => {
            tag::check(t)?;
            let others: Vec<String> = written
                .iter()
                .filter_map(|(p, _, n)| {
                    let s = pool.segment_of(*p)?;
                    (s.tag != t).then(|| format!("`{n}` (tag {})", tag::name_of(s.tag)))
                })
                .collect();
            if !others.is_empty() {
                problems.push(format!(
                    "the update versions tag {} but destinations lie in other tags: {}",
                    tag::name_of(t),
                    others.join(", ")
                ));
            }
            Some(t)
        }
        None => {
            // Without a plan, the tags of every destination stand in for
            // those written, so the version is still checked and listed.
            let ptrs: Vec<DevicePtr> = if plan.is_some() {
                written.iter().map(|w| w.0).collect()
            } else {
                registry.iter().map(|d| d.ptr).collect()
            };
            let mut tags: Vec<TagId> = ptrs
                .iter()
                .filter_map(|p| pool.segment_of(*p).map(|s| s.tag))
                .collect();
            tags.sort();
            tags.dedup();
            match tags.as_slice() {
                [t] => Some(*t),
                [] if ptrs.is_empty() || (plan.is_some() && written.is_empty()) => None,
                [] => {
                    problems.push(
                        "the destinations lie outside the pool: name the tag to version".into(),
                    );
                    None
                }
                many => {
                    problems.push(format!(
                        "the destinations span tags {}: an update versions one tag; update each tag on its own",
                        many.iter().map(|t| tag::name_of(*t)).collect::<Vec<_>>().join(", ")
                    ));
                    None
                }
            }
        }
    };
    if let Some(t) = tag {
        let current = pool.tag_version(t)?;
        if current != expected {
            if problems.is_empty() {
                return Err(Error::VersionMismatch {
                    tag: tag::name_of(t),
                    expected,
                    current,
                });
            }
            problems.push(format!(
                "tag {} is at version {current}, the update expects {expected}",
                tag::name_of(t)
            ));
        }
    }
    if !problems.is_empty() {
        return Err(Error::Plan(format!(
            "update refused, nothing written:\n{}",
            problems.join("\n")
        )));
    }
    let plan = plan.expect("no problem means a plan");
    let Some(tag) = tag else {
        return Err(Error::Plan(
            "update refused, nothing written: no destination receives any source tensor".into(),
        ));
    };
    let resolved = resolved.expect("a plan was resolved");
    Ok(UpdatePlan {
        plan,
        resolved,
        tag,
    })
}

/// The plan `plan_for` makes from the manifest's tensors (each numbered by
/// its place, whole from offset 0); the manifest's own problems (a size that
/// overflows, a name given twice) and a plan refused go to `problems`.
fn plan_of(
    manifest: &[SourceTensor],
    plan_for: PlanFor<'_>,
    opts: &PlanOptions,
    problems: &mut Vec<String>,
) -> Result<Option<Arc<Plan>>> {
    let mut tensors = BTreeMap::new();
    for (i, t) in manifest.iter().enumerate() {
        let Some(len) = t.bytes() else {
            problems.push(format!(
                "`{}`: shape {:?} of {} overflows",
                t.name, t.shape, t.dtype
            ));
            continue;
        };
        let info = TensorInfo {
            name: t.name.clone(),
            shard: i,
            dtype: t.dtype,
            shape: t.shape.clone(),
            offset: 0,
            len,
        };
        if tensors.insert(t.name.clone(), info).is_some() {
            problems.push(format!("`{}` is in the source twice", t.name));
        }
    }
    match plan_for(&tensors, opts) {
        Ok(p) => Ok(Some(p)),
        Err(Error::Plan(s)) => {
            problems.push(s);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// True when `tensors` are what [`plan_of`] makes of `manifest`: then the
/// manifest's names are distinct (each maps to its own place) and no size
/// overflows. Compared without building the set, walking it in order (no
/// lookups): each entry must name the tensor at its place, and the names
/// are distinct, so as many entries as tensors are one per place.
fn made_from(manifest: &[SourceTensor], tensors: &BTreeMap<String, TensorInfo>) -> bool {
    tensors.len() == manifest.len()
        && tensors.iter().all(|(name, x)| {
            manifest.get(x.shard).is_some_and(|t| {
                t.name == *name
                    && x.dtype == t.dtype
                    && x.shape == t.shape
                    && x.offset == 0
                    && Some(x.len) == t.bytes()
            })
        })
}

impl UpdatePlan {
    /// The extents reading tensor `t`.
    pub fn extents_of(&self, t: usize) -> impl Iterator<Item = &Extent> {
        self.resolved.by_tensor[t]
            .iter()
            .map(|&i| &self.plan.extents[i])
    }

    /// Each destination the update writes, whole: `(address, bytes, name)`,
    /// by address.
    pub fn written(&self) -> &[(DevicePtr, usize, String)] {
        &self.resolved.written
    }

    /// Bytes the update writes into destinations.
    pub fn dst_bytes(&self) -> u64 {
        self.plan.dst_bytes()
    }
}
