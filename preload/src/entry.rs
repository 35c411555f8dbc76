//! The CUDA runtime functions this library defines, with C linkage: the
//! process's references to them resolve here (the library is preloaded,
//! first in the global scope) and everything not ours goes on to the
//! runtime. Each is a panic boundary: a panic inside (a bug) passes the
//! call to the runtime unchanged, never unwinding into the process.
//!
//! Defined: `cudaMalloc`, `cudaMallocPitch`, `cudaFree`, `cudaMemGetInfo`.
//! Not defined, so they resolve to the runtime: `cudaMallocManaged`,
//! `cudaMallocHost`/`cudaHostAlloc`/`cudaFreeHost`, `cudaMallocAsync`/
//! `cudaFreeAsync` (stream-ordered pools are the runtime's), `cudaMalloc3D`,
//! arrays, and every driver API call (`cuMemAlloc`, `cuMemCreate`: ggml's
//! own VMM pool stays outside our memory).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::cuda::cudaError_t;
use crate::{alloc, real, served};

/// Run `ours`; a panic runs `runtime` instead.
fn boundary(
    ours: impl FnOnce() -> cudaError_t,
    runtime: impl FnOnce() -> cudaError_t,
) -> cudaError_t {
    match catch_unwind(AssertUnwindSafe(|| {
        served::serve_on_first_call();
        ours()
    })) {
        Ok(rc) => rc,
        Err(_) => runtime(),
    }
}

/// `cudaMalloc`.
///
/// # Safety
/// As the runtime's: `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> cudaError_t {
    boundary(
        // SAFETY: forwarded contract.
        || unsafe { alloc::malloc(ptr, size) },
        // SAFETY: forwarded contract.
        || unsafe { real::malloc(ptr, size) },
    )
}

/// `cudaMallocPitch`.
///
/// # Safety
/// As the runtime's: `ptr` and `pitch` are writable.
#[no_mangle]
pub unsafe extern "C" fn cudaMallocPitch(
    ptr: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> cudaError_t {
    boundary(
        // SAFETY: forwarded contract.
        || unsafe { alloc::malloc_pitch(ptr, pitch, width, height) },
        // SAFETY: forwarded contract.
        || unsafe { real::malloc_pitch(ptr, pitch, width, height) },
    )
}

/// `cudaFree`.
///
/// # Safety
/// As the runtime's.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: *mut c_void) -> cudaError_t {
    boundary(
        // SAFETY: forwarded contract.
        || unsafe { alloc::free(ptr) },
        // SAFETY: forwarded contract.
        || unsafe { real::free(ptr) },
    )
}

/// `cudaMemGetInfo`.
///
/// # Safety
/// As the runtime's: `free` and `total` are writable.
#[no_mangle]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> cudaError_t {
    boundary(
        // SAFETY: forwarded contract.
        || unsafe { alloc::mem_get_info(free, total) },
        // SAFETY: forwarded contract.
        || unsafe { real::mem_get_info(free, total) },
    )
}
