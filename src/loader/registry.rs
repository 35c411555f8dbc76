//! Destinations: the parameters the loader fills, each a device pointer with
//! a name, dtype and shape. Registered by the caller (from C, Go, or a
//! PyTorch model's `data_ptr()`), or allocated by the loader from the plan
//! through a [`DestAllocator`] (the pool implements it; [`SegmentAllocator`]
//! is a simple one over segments).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::dtype::Dtype;
use crate::driver::{DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::pool::Owner;
use crate::segment::Segment;

/// One destination parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// The destination name the mapping rules produce.
    pub name: String,
    /// Device address of element 0.
    pub ptr: DevicePtr,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major, contiguous).
    pub shape: Vec<usize>,
}

/// Bytes of a contiguous tensor of `shape` and `dtype`; None when the count
/// overflows (a shape no memory can hold) or, for a quantized type, when the
/// last dimension is not a whole number of blocks ([`Dtype::bytes`]).
pub fn byte_size(shape: &[usize], dtype: Dtype) -> Option<usize> {
    dtype
        .bytes_of(shape.iter().map(|&d| d as u64))
        .and_then(|b| usize::try_from(b).ok())
}

impl Destination {
    /// Bytes the destination spans (registered destinations always fit).
    pub fn bytes(&self) -> usize {
        byte_size(&self.shape, self.dtype).unwrap_or(usize::MAX)
    }
}

/// What a destination must look like (name, dtype, shape), without memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestSpec {
    /// Destination name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
}

impl DestSpec {
    /// Bytes the destination needs (usize::MAX when the shape overflows, which
    /// no allocator can satisfy; [`crate::loader::Plan::destinations`] refuses such shapes).
    pub fn bytes(&self) -> usize {
        byte_size(&self.shape, self.dtype).unwrap_or(usize::MAX)
    }
}

/// Device memory for destinations the loader allocates itself.
pub trait DestAllocator {
    /// Allocate `bytes` of device memory (aligned to at least 256 bytes).
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
}

/// The set of destinations a load fills, by name, and the device ranges the
/// caller declared as its own (memory outside any pool the load checks).
///
/// Two names may share one destination when they are exact aliases: same
/// address, dtype and shape, as tied parameters in a PyTorch `state_dict()`
/// (`lm_head.weight` and `model.embed_tokens.weight`). The destination is
/// listed once, under the name registered first, and filled from whichever of
/// its names the checkpoint has.
///
/// Each destination's [`Owner`] is recorded when it is registered (the pool
/// block holding it, in any pool of the process, or none): a load refuses a
/// destination whose owner changed since ([`crate::pool::check_owner`]).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    dests: BTreeMap<String, Destination>,
    /// Destination name -> what owned its memory when it was registered.
    owners: BTreeMap<String, Owner>,
    foreign: Vec<(DevicePtr, u64)>,
    /// Alias name -> the name its destination is listed under.
    aliases: BTreeMap<String, String>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Register a destination. Rejects a duplicate name, a NULL pointer, an
    /// empty name, a shape whose byte size overflows or whose range runs past
    /// the end of the address space, and a range that overlaps an already
    /// registered destination unless it is an exact alias of it (same
    /// address, dtype and shape). Records the destination's [`Owner`] now
    /// (must not be called while holding a pool's lock).
    pub fn register(
        &mut self,
        name: &str,
        ptr: DevicePtr,
        dtype: Dtype,
        shape: &[usize],
    ) -> Result<()> {
        if name.is_empty() {
            return Err(Error::InvalidArgument(
                "destination name must not be empty".into(),
            ));
        }
        if ptr == 0 {
            return Err(Error::InvalidArgument(format!(
                "destination `{name}` has a NULL device pointer"
            )));
        }
        if self.dests.contains_key(name) || self.aliases.contains_key(name) {
            return Err(Error::InvalidArgument(format!(
                "destination `{name}` is already registered"
            )));
        }
        if shape.len() > super::checkpoint::MAX_DIMS {
            return Err(Error::InvalidArgument(format!(
                "destination `{name}` has {} dimensions; at most {} are supported",
                shape.len(),
                super::checkpoint::MAX_DIMS
            )));
        }
        if dtype.is_quantized()
            && shape
                .last()
                .is_none_or(|l| !l.is_multiple_of(dtype.block()))
        {
            return Err(Error::InvalidArgument(format!(
                "destination `{name}`: shape {shape:?} of {dtype}: the last dimension must be a whole number of blocks of {}",
                dtype.block()
            )));
        }
        let bytes = byte_size(shape, dtype)
            .filter(|&b| b as u64 <= u64::MAX - ptr)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "destination `{name}`: shape {shape:?} of {dtype} at {ptr:#x} does not fit in the address space (byte size overflows)"
                ))
            })?;
        let d = Destination {
            name: name.to_owned(),
            ptr,
            dtype,
            shape: shape.to_vec(),
        };
        if let Some(o) = self.dests.values().find(|o| is_alias(o, &d)) {
            self.aliases.insert(d.name, o.name.clone());
            return Ok(());
        }
        let (lo, hi) = (d.ptr, d.ptr + bytes as u64);
        if let Some(o) = self.dests.values().find(|o| {
            let (a, b) = (o.ptr, o.ptr + o.bytes() as u64);
            lo < b && a < hi && d.bytes() > 0 && o.bytes() > 0
        }) {
            return Err(Error::InvalidArgument(format!(
                "destination `{name}` [{lo:#x}, {hi:#x}) overlaps destination `{}` [{:#x}, {:#x})",
                o.name,
                o.ptr,
                o.ptr + o.bytes() as u64
            )));
        }
        self.owners
            .insert(d.name.clone(), crate::pool::owner_of(d.ptr));
        self.dests.insert(d.name.clone(), d);
        Ok(())
    }

    /// Allocate and register every spec through `alloc`. On failure nothing is registered
    /// (memory already obtained from `alloc` stays with the allocator).
    pub fn allocate(&mut self, specs: &[DestSpec], alloc: &dyn DestAllocator) -> Result<()> {
        let mut staged = self.clone();
        for s in specs {
            let ptr = alloc.alloc(s.bytes().max(1))?;
            staged.register(&s.name, ptr, s.dtype, &s.shape)?;
        }
        *self = staged;
        Ok(())
    }

    /// Declare `[ptr, ptr + len)` as device memory the caller owns outside
    /// the pool a load runs on (cudaMalloc'd, another allocator's): a
    /// destination lying wholly inside one declared range is not checked
    /// against the pool. The caller vouches that it is mapped and stays so
    /// while loads run. Refuses an empty or overflowing range.
    pub fn declare_foreign(&mut self, ptr: DevicePtr, len: u64) -> Result<()> {
        if ptr == 0 || len == 0 || ptr.checked_add(len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "foreign range at {ptr:#x} of {len} bytes must be non-NULL, non-empty and inside the address space"
            )));
        }
        self.foreign.push((ptr, len));
        Ok(())
    }

    /// True when `[ptr, ptr + len)` lies wholly inside one declared foreign range.
    pub fn in_foreign(&self, ptr: DevicePtr, len: u64) -> bool {
        self.foreign
            .iter()
            .any(|&(a, l)| ptr >= a && ptr.saturating_add(len) <= a + l)
    }

    /// What owned `d`'s memory when it was registered ([`Owner::Outside`]
    /// for a destination not registered here).
    pub fn owner(&self, d: &Destination) -> Owner {
        self.owners.get(&d.name).copied().unwrap_or(Owner::Outside)
    }

    /// The destination named `name` (also when `name` is an alias of it).
    pub fn get(&self, name: &str) -> Option<&Destination> {
        self.dests.get(self.primary(name))
    }

    /// The name `name`'s destination is listed under: `name` itself unless it
    /// is an alias.
    pub fn primary<'a>(&'a self, name: &'a str) -> &'a str {
        self.aliases.get(name).map(String::as_str).unwrap_or(name)
    }

    /// Every alias with the name its destination is listed under.
    pub fn aliases(&self) -> impl Iterator<Item = (&str, &str)> {
        self.aliases.iter().map(|(a, p)| (a.as_str(), p.as_str()))
    }

    /// Every destination, once, by the name it is listed under.
    pub fn iter(&self) -> impl Iterator<Item = &Destination> {
        self.dests.values()
    }

    /// Number of destinations.
    pub fn len(&self) -> usize {
        self.dests.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.dests.is_empty()
    }
}

/// Exact alias: one parameter under two names (a partial overlap is not).
fn is_alias(a: &Destination, b: &Destination) -> bool {
    a.ptr == b.ptr && a.dtype == b.dtype && a.shape == b.shape && a.bytes() > 0
}

/// A bump allocator over segments: carves destinations out of segments of at
/// least `segment_bytes`, 256-byte aligned. Memory lives as long as the allocator.
#[derive(Debug)]
pub struct SegmentAllocator {
    driver: Arc<dyn Driver>,
    segment_bytes: usize,
    state: Mutex<(Vec<Segment>, usize)>,
}

const ALIGN: usize = 256;

impl SegmentAllocator {
    /// An allocator that maps segments of at least `segment_bytes` on `driver`.
    pub fn new(driver: Arc<dyn Driver>, segment_bytes: usize) -> SegmentAllocator {
        SegmentAllocator {
            driver,
            segment_bytes: segment_bytes.max(1),
            state: Mutex::new((Vec::new(), 0)),
        }
    }

    /// The segments allocated so far.
    pub fn segment_count(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }
}

impl DestAllocator for SegmentAllocator {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (segs, used) = &mut *st;
        let need = bytes.div_ceil(ALIGN) * ALIGN;
        if let Some(last) = segs.last() {
            if *used + need <= last.reserved() {
                let p = last.ptr() + *used as u64;
                *used += need;
                return Ok(p);
            }
        }
        let seg = Segment::allocate(self.driver.clone(), need.max(self.segment_bytes), 0)?;
        let p = seg.ptr();
        segs.push(seg);
        *used = need;
        Ok(p)
    }
}
