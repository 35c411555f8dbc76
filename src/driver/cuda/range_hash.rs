//! `hash_ranges` on the device: the range-hash kernel (`kernels/hash.cu`,
//! committed as `hash.ptx` beside this file), loaded once per driver, and one
//! launch over the tiles of every range asked for.

use std::ffi::{c_void, CStr};

use super::{cu, CudaDriver};
use crate::driver::hash;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};

/// The kernel's PTX, NUL-terminated for `cuModuleLoadData`.
const PTX: &CStr =
    match CStr::from_bytes_with_nul(concat!(include_str!("hash.ptx"), "\0").as_bytes()) {
        Ok(ptx) => ptx,
        Err(_) => panic!("hash.ptx holds a NUL byte"),
    };
const ENTRY: &CStr = c"vmmw_hash_tiles";
/// Threads per block (a multiple of 32: the kernel reduces warp by warp).
const THREADS: u32 = 256;
/// Most blocks launched; each loops over tiles.
const MAX_BLOCKS: u64 = 8192;

/// The loaded module and its one function.
#[derive(Debug)]
pub(super) struct HashKernel {
    pub(super) module: cu::Module,
    function: cu::Function,
}

/// Device memory from `cuMemAlloc`, freed on drop: the tile list and the sums.
struct Scratch(DevicePtr);

impl Drop for Scratch {
    fn drop(&mut self) {
        // Every launch is synchronized before the scratch drops, so no work
        // uses it; a failure has nowhere to go.
        let _ = cu::mem_free(self.0);
    }
}

impl CudaDriver {
    fn hash_kernel(&self) -> Result<&HashKernel> {
        let loaded = self.hash_kernel.get_or_init(|| {
            // The context is current: callers bind first.
            let module = cu::module_load_data(PTX).map_err(|e| Error::from(e).to_string())?;
            let function =
                cu::module_get_function(&module, ENTRY).map_err(|e| Error::from(e).to_string())?;
            Ok(HashKernel { module, function })
        });
        loaded.as_ref().map_err(|e| Error::Driver {
            call: "cuModuleLoadData",
            code: -1,
            name: "range-hash kernel failed to load".into(),
            detail: format!(": {e}"),
        })
    }

    /// Hash `ranges` on the device. The caller has bound the context.
    ///
    /// # Safety
    /// Every range is mapped and readable by this device, and no queued work
    /// still writes it.
    pub(super) unsafe fn hash_on_device(&self, ranges: &[(DevicePtr, usize)]) -> Result<Vec<u64>> {
        let tiles = hash::tiles(ranges);
        if tiles.is_empty() {
            return Ok(ranges.iter().map(|&(_, l)| hash::finish(0, l)).collect());
        }
        let k = self.hash_kernel()?;
        let tile_bytes = std::mem::size_of_val(tiles.as_slice());
        let sum_bytes = ranges.len() * 8;
        let base = cu::mem_alloc(tile_bytes + sum_bytes).map_err(|e| {
            e.detail(|| {
                format!(
                    "{} bytes for hashing {} ranges",
                    tile_bytes + sum_bytes,
                    ranges.len()
                )
            })
        })?;
        let scratch = Scratch(base);
        let sums_dev = scratch.0 + tile_bytes as u64;
        // SAFETY: the destination was just allocated with room for the tiles
        // and no work uses it (synchronous copy).
        unsafe { cu::memcpy_htod(scratch.0, &tiles) }?;
        // SAFETY: the sums lie inside the scratch allocation, which no work uses.
        unsafe { cu::memset_d8(sums_dev, 0, sum_bytes) }?;
        let (mut p_tiles, mut p_n, mut p_sums) = (scratch.0, tiles.len() as u64, sums_dev);
        let mut params = [
            &mut p_tiles as *mut u64 as *mut c_void,
            &mut p_n as *mut u64 as *mut c_void,
            &mut p_sums as *mut u64 as *mut c_void,
        ];
        let blocks = (tiles.len() as u64).min(MAX_BLOCKS) as u32;
        // SAFETY: the kernel takes (const Tile*, u64, u64*); `params` points
        // at three u64 values. The tile list and sums lie in the scratch; the
        // tiles lie in ranges the caller guarantees readable.
        unsafe {
            cu::launch_kernel(
                k.function,
                blocks,
                THREADS,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(|e| e.detail(|| format!("vmmw_hash_tiles over {} tiles", tiles.len())))?;
        cu::ctx_synchronize()?;
        let mut sums = vec![0u64; ranges.len()];
        // SAFETY: u64 takes any bit pattern; the `sum_bytes` of sums lie in
        // the scratch; the kernel has finished.
        unsafe { cu::memcpy_dtoh(&mut sums, sums_dev) }?;
        Ok(sums
            .iter()
            .zip(ranges)
            .map(|(&s, &(_, len))| hash::finish(s, len))
            .collect())
    }
}
