//! `hash_ranges` on the device: the range-hash kernel (`kernels/hash.cu`,
//! committed as `hash.ptx` beside this file), loaded once per driver, and one
//! launch over the tiles of every range asked for.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::{check, check_with, CudaDriver};
use crate::driver::hash;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};

/// The kernel's PTX, NUL-terminated for `cuModuleLoadData`.
const PTX: &str = concat!(include_str!("hash.ptx"), "\0");
const ENTRY: &std::ffi::CStr = c"vmmw_hash_tiles";
/// Threads per block (a multiple of 32: the kernel reduces warp by warp).
const THREADS: u32 = 256;
/// Most blocks launched; each loops over tiles.
const MAX_BLOCKS: u64 = 8192;

/// The loaded module and its one function.
#[derive(Debug)]
pub(super) struct HashKernel {
    pub(super) module: sys::CUmodule,
    function: sys::CUfunction,
}
// SAFETY: module and function handles are context-bound driver objects usable
// from any thread once the context is current; we never dereference them.
unsafe impl Send for HashKernel {}
// SAFETY: as above; immutable after loading.
unsafe impl Sync for HashKernel {}

/// Device memory from `cuMemAlloc`, freed on drop: the tile list and the sums.
struct Scratch(sys::CUdeviceptr);

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc below, freed once, no work uses it
        // (every launch is synchronized before the scratch drops).
        unsafe { sys::cuMemFree_v2(self.0) };
    }
}

impl CudaDriver {
    fn hash_kernel(&self) -> Result<&HashKernel> {
        let loaded = self.hash_kernel.get_or_init(|| {
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: the context is current (callers bind first); the image
            // is NUL-terminated PTX that outlives the call.
            let rc = unsafe { sys::cuModuleLoadData(&mut module, PTX.as_ptr() as *const c_void) };
            check("cuModuleLoadData", rc).map_err(|e| e.to_string())?;
            let mut function: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: module was loaded above; the name is NUL-terminated.
            let rc = unsafe { sys::cuModuleGetFunction(&mut function, module, ENTRY.as_ptr()) };
            check("cuModuleGetFunction", rc).map_err(|e| e.to_string())?;
            Ok(HashKernel { module, function })
        });
        loaded.as_ref().map_err(|e| Error::Driver {
            call: "cuModuleLoadData",
            code: -1,
            name: "range-hash kernel failed to load".into(),
            detail: format!(": {e}"),
        })
    }

    /// Hash `ranges` on the device. The caller has bound the context and
    /// guarantees every range is mapped, readable and idle.
    pub(super) fn hash_on_device(&self, ranges: &[(DevicePtr, usize)]) -> Result<Vec<u64>> {
        let tiles = hash::tiles(ranges);
        if tiles.is_empty() {
            return Ok(ranges.iter().map(|&(_, l)| hash::finish(0, l)).collect());
        }
        let k = self.hash_kernel()?;
        let tile_bytes = std::mem::size_of_val(tiles.as_slice());
        let sum_bytes = ranges.len() * 8;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer.
        let rc = unsafe { sys::cuMemAlloc_v2(&mut base, tile_bytes + sum_bytes) };
        check_with("cuMemAlloc", rc, || {
            format!(
                "{} bytes for hashing {} ranges",
                tile_bytes + sum_bytes,
                ranges.len()
            )
        })?;
        let scratch = Scratch(base);
        let sums_dev = scratch.0 + tile_bytes as u64;
        // SAFETY: `tiles` is `tile_bytes` of plain #[repr(C)] data; the
        // destination was just allocated with room for it (synchronous copy).
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(scratch.0, tiles.as_ptr() as *const c_void, tile_bytes)
        })?;
        // SAFETY: the sums lie inside the scratch allocation.
        check("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(sums_dev, 0, sum_bytes)
        })?;
        let (mut p_tiles, mut p_n, mut p_sums) = (scratch.0, tiles.len() as u64, sums_dev);
        let mut params = [
            &mut p_tiles as *mut u64 as *mut c_void,
            &mut p_n as *mut u64 as *mut c_void,
            &mut p_sums as *mut u64 as *mut c_void,
        ];
        let blocks = (tiles.len() as u64).min(MAX_BLOCKS) as u32;
        // SAFETY: the kernel takes (const Tile*, u64, u64*); `params` points
        // at three u64 values that live until the call returns. The tiles lie
        // in ranges the caller guarantees readable.
        let rc = unsafe {
            sys::cuLaunchKernel(
                k.function,
                blocks,
                1,
                1,
                THREADS,
                1,
                1,
                0,
                std::ptr::null_mut(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check_with("cuLaunchKernel", rc, || {
            format!("vmmw_hash_tiles over {} tiles", tiles.len())
        })?;
        // SAFETY: no arguments; the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        let mut sums = vec![0u64; ranges.len()];
        // SAFETY: `sums` has room for `sum_bytes`; the kernel has finished.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(sums.as_mut_ptr() as *mut c_void, sums_dev, sum_bytes)
        })?;
        Ok(sums
            .iter()
            .zip(ranges)
            .map(|(&s, &(_, len))| hash::finish(s, len))
            .collect())
    }
}
